"""A fixed, deterministic set of stress inputs for the NaN/Inf scan.

Natural images rarely reach the corners of the input range where FP8 activation scales, calibrated
on natural images, overflow or a fused kernel misbehaves. These inputs go there on purpose. Each is
one 3xHxW float32 image in preprocessed space (H, W from `Preprocessing.input_size`).

`pixel/*` inputs are built as pixel values in [0, 1] and then normalised with the checkpoint's
mean/std, so they are images a camera could produce. `pre/*` inputs are built directly in
preprocessed space, some of them beyond what normalisation of any [0, 1] image yields. Below,
lo_c = (0 - mean_c) / std_c and hi_c = (1 - mean_c) / std_c are the per-channel edges of the
preprocessing range, and B = 3 * max_c max(|lo_c|, |hi_c|) is three times the largest magnitude
normalisation can produce. Checkerboard "period" p is the side of one square in pixels. Random
inputs draw from `torch.Generator` with the fixed seed given, one generator per input, so adding
an input never changes another.

| name | built in | what |
| --- | --- | --- |
| pixel/black | pixel | all 0: every channel at its lower range edge lo_c |
| pixel/white | pixel | all 1: every channel at its upper range edge hi_c |
| pixel/gray | pixel | all 0.5 |
| pixel/red | pixel | saturated red: R = 1, G = B = 0 |
| pixel/green | pixel | saturated green: G = 1, R = B = 0 |
| pixel/blue | pixel | saturated blue: B = 1, R = G = 0 |
| pixel/uniform | pixel | uniform noise on [0, 1], seed 101 |
| pixel/uniform_w0.1 | pixel | uniform noise on [0.45, 0.55], seed 102 |
| pixel/gauss_s0.05 | pixel | 0.5 + Gaussian noise, sd 0.05, clipped to [0, 1], seed 103 |
| pixel/gauss_s0.2 | pixel | 0.5 + Gaussian noise, sd 0.2, clipped to [0, 1], seed 104 |
| pixel/gauss_s0.5 | pixel | 0.5 + Gaussian noise, sd 0.5, clipped to [0, 1], seed 105 |
| pixel/checker_p1 | pixel | black/white checkerboard, period 1 px (alternate pixels) |
| pixel/checker_p2 | pixel | black/white checkerboard, period 2 px |
| pixel/checker_p8 | pixel | black/white checkerboard, period 8 px |
| pixel/checker_p32 | pixel | black/white checkerboard, period 32 px |
| pixel/impulse_center | pixel | black with one white pixel (all channels 1) at (H//2, W//2) |
| pixel/impulse_corner | pixel | black with one white pixel (all channels 1) at (0, 0) |
| pixel/hgrad | pixel | horizontal gradient: 0 at the left column to 1 at the right |
| pixel/vgrad | pixel | vertical gradient: 0 at the top row to 1 at the bottom |
| pre/zeros | pre | all 0: the mean colour of the normalisation |
| pre/range_alt | pre | per pixel and channel alternating lo_c / hi_c, channel phases offset |
| pre/gauss_s1 | pre | Gaussian noise, sd 1, seed 201 |
| pre/gauss_s3 | pre | Gaussian noise, sd 3, seed 202 |
| pre/gauss_s10 | pre | Gaussian noise, sd 10, seed 203 |
| pre/uniform_beyond | pre | uniform noise on [-B, B], seed 204 |
| pre/beyond_pos | pre | all +B |
| pre/beyond_neg | pre | all -B |
| pre/beyond_alt | pre | +B / -B checkerboard, period 1 px |
| pre/impulse_beyond | pre | all 0 with one pixel at +B (all channels) at (H//2, W//2) |

The range edges need no entries of their own: pixel/black and pixel/white are exactly the
per-channel lo_c and hi_c images.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from quantstudy.record import Preprocessing


@dataclass(frozen=True)
class Canvas:
    """Image size and normalisation shared by every builder."""

    h: int
    w: int
    mean: torch.Tensor  # (3, 1, 1)
    std: torch.Tensor  # (3, 1, 1)

    @classmethod
    def of(cls, pre: Preprocessing) -> Canvas:
        channels, h, w = pre.input_size
        if channels != 3:
            raise ValueError(f"stress inputs are 3-channel images, input_size is {pre.input_size}")
        as_column = partial(torch.tensor, dtype=torch.float64)
        return cls(
            h=h,
            w=w,
            mean=as_column(pre.mean).view(3, 1, 1),
            std=as_column(pre.std).view(3, 1, 1),
        )

    @property
    def lo(self) -> torch.Tensor:
        return (0.0 - self.mean) / self.std

    @property
    def hi(self) -> torch.Tensor:
        return (1.0 - self.mean) / self.std

    @property
    def beyond(self) -> float:
        """B: three times the largest magnitude normalisation of a [0, 1] image can produce."""
        return 3.0 * float(torch.maximum(self.lo.abs(), self.hi.abs()).max())

    def full(self, value: float) -> torch.Tensor:
        return torch.full((3, self.h, self.w), value, dtype=torch.float64)

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        return (pixels - self.mean) / self.std

    def checker(self, period: int) -> torch.Tensor:
        """(1, H, W) pattern, 1.0 on the squares where (i // p + j // p) is odd."""
        i = torch.arange(self.h).view(-1, 1) // period
        j = torch.arange(self.w).view(1, -1) // period
        return ((i + j) % 2).to(torch.float64).unsqueeze(0)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)


# --- builders in pixel space: return values in [0, 1] -------------------------------------


def constant(c: Canvas, value: float) -> torch.Tensor:
    return c.full(value)


def saturated(c: Canvas, channel: int) -> torch.Tensor:
    x = c.full(0.0)
    x[channel] = 1.0
    return x


def uniform_pixels(c: Canvas, seed: int, width: float) -> torch.Tensor:
    u = torch.rand((3, c.h, c.w), generator=c.generator(seed), dtype=torch.float64)
    return 0.5 + (u - 0.5) * width


def gauss_pixels(c: Canvas, seed: int, sd: float) -> torch.Tensor:
    n = torch.randn((3, c.h, c.w), generator=c.generator(seed), dtype=torch.float64)
    return (0.5 + sd * n).clamp(0.0, 1.0)


def checker_pixels(c: Canvas, period: int) -> torch.Tensor:
    return c.checker(period).expand(3, c.h, c.w).clone()


def impulse(c: Canvas, where: Literal["center", "corner"]) -> torch.Tensor:
    x = c.full(0.0)
    row, col = (c.h // 2, c.w // 2) if where == "center" else (0, 0)
    x[:, row, col] = 1.0
    return x


def gradient(c: Canvas, axis: Literal["h", "v"]) -> torch.Tensor:
    if axis == "h":
        ramp = torch.linspace(0.0, 1.0, c.w, dtype=torch.float64).view(1, 1, -1)
    else:
        ramp = torch.linspace(0.0, 1.0, c.h, dtype=torch.float64).view(1, -1, 1)
    return ramp.expand(3, c.h, c.w).clone()


# --- builders in preprocessed space -------------------------------------------------------


def range_alternating(c: Canvas) -> torch.Tensor:
    """Channel k takes hi_k where (i + j + k) is even, else lo_k: neighbours and channels differ."""
    phase = c.checker(1).squeeze(0)
    channel_phase = torch.stack([(phase + k) % 2 for k in range(3)])
    return torch.where(channel_phase == 0, c.hi, c.lo)


def gauss_pre(c: Canvas, seed: int, sd: float) -> torch.Tensor:
    return sd * torch.randn((3, c.h, c.w), generator=c.generator(seed), dtype=torch.float64)


def uniform_beyond(c: Canvas, seed: int) -> torch.Tensor:
    u = torch.rand((3, c.h, c.w), generator=c.generator(seed), dtype=torch.float64)
    return (2.0 * u - 1.0) * c.beyond


def beyond(c: Canvas, sign: float) -> torch.Tensor:
    return c.full(sign * c.beyond)


def beyond_alternating(c: Canvas) -> torch.Tensor:
    return ((2.0 * c.checker(1) - 1.0) * c.beyond).expand(3, c.h, c.w).clone()


def impulse_beyond(c: Canvas) -> torch.Tensor:
    x = c.full(0.0)
    x[:, c.h // 2, c.w // 2] = c.beyond
    return x


@dataclass(frozen=True)
class StressInput:
    name: str
    space: Literal["pixel", "pre"]
    build: Callable[[Canvas], torch.Tensor]


# The registry: order is the order of the stress batch and of the report. Documented above.
STRESS_INPUTS: tuple[StressInput, ...] = (
    StressInput("pixel/black", "pixel", partial(constant, value=0.0)),
    StressInput("pixel/white", "pixel", partial(constant, value=1.0)),
    StressInput("pixel/gray", "pixel", partial(constant, value=0.5)),
    StressInput("pixel/red", "pixel", partial(saturated, channel=0)),
    StressInput("pixel/green", "pixel", partial(saturated, channel=1)),
    StressInput("pixel/blue", "pixel", partial(saturated, channel=2)),
    StressInput("pixel/uniform", "pixel", partial(uniform_pixels, seed=101, width=1.0)),
    StressInput("pixel/uniform_w0.1", "pixel", partial(uniform_pixels, seed=102, width=0.1)),
    StressInput("pixel/gauss_s0.05", "pixel", partial(gauss_pixels, seed=103, sd=0.05)),
    StressInput("pixel/gauss_s0.2", "pixel", partial(gauss_pixels, seed=104, sd=0.2)),
    StressInput("pixel/gauss_s0.5", "pixel", partial(gauss_pixels, seed=105, sd=0.5)),
    StressInput("pixel/checker_p1", "pixel", partial(checker_pixels, period=1)),
    StressInput("pixel/checker_p2", "pixel", partial(checker_pixels, period=2)),
    StressInput("pixel/checker_p8", "pixel", partial(checker_pixels, period=8)),
    StressInput("pixel/checker_p32", "pixel", partial(checker_pixels, period=32)),
    StressInput("pixel/impulse_center", "pixel", partial(impulse, where="center")),
    StressInput("pixel/impulse_corner", "pixel", partial(impulse, where="corner")),
    StressInput("pixel/hgrad", "pixel", partial(gradient, axis="h")),
    StressInput("pixel/vgrad", "pixel", partial(gradient, axis="v")),
    StressInput("pre/zeros", "pre", partial(constant, value=0.0)),
    StressInput("pre/range_alt", "pre", range_alternating),
    StressInput("pre/gauss_s1", "pre", partial(gauss_pre, seed=201, sd=1.0)),
    StressInput("pre/gauss_s3", "pre", partial(gauss_pre, seed=202, sd=3.0)),
    StressInput("pre/gauss_s10", "pre", partial(gauss_pre, seed=203, sd=10.0)),
    StressInput("pre/uniform_beyond", "pre", partial(uniform_beyond, seed=204)),
    StressInput("pre/beyond_pos", "pre", partial(beyond, sign=1.0)),
    StressInput("pre/beyond_neg", "pre", partial(beyond, sign=-1.0)),
    StressInput("pre/beyond_alt", "pre", beyond_alternating),
    StressInput("pre/impulse_beyond", "pre", impulse_beyond),
)


def stress_inputs(pre: Preprocessing) -> list[tuple[str, torch.Tensor]]:
    """Build every stress input for this preprocessing: (name, 3xHxW float32 preprocessed image).

    Built in float64 and cast once, so the pixel-space inputs normalise without extra rounding.
    """
    canvas = Canvas.of(pre)
    out = []
    for item in STRESS_INPUTS:
        x = item.build(canvas)
        if item.space == "pixel":
            x = canvas.normalise(x)
        out.append((item.name, x.to(torch.float32).contiguous()))
    return out
