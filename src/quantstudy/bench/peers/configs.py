"""torchao's float8 inference configs as peers of our FP8 engine, and which layers each takes.

Pure (no torch, no torchao import), so the choices are tested on any machine:

- `Peer`: the configs this bench builds, each with its torchao class, scales and dtype.
- `peer_layers`: of the recipe's selected layers, those the config runs in FP8, and why each
  other one stays in half precision. It restates what torchao does with a layer it is given:
  a linear whose features are not multiples of 16 is left as it is, silently (torch._scaled_mm
  takes multiples of 16); its FP8 conv takes per-tensor scales only, and runs only through the
  `mslk` package on compute capability 10.0 or newer; the static config takes linears only.
  The engine's builder then counts what torchao really quantized, which the record holds.
- `torchao_refusal` / `device_refusal`: why a torchao engine cannot be built here, in one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from quantstudy.record import LayerDecision

# The oldest torchao whose float8 configs this bench drives (the static config's
# prepare/convert flow, `set_inductor_config`, and the dynamic config's conv2d weights), and
# the oldest torch its compiled kernels load with (torchao's own import check).
TORCHAO_FLOOR = (0, 17)
TORCH_FLOOR = (2, 11)
INSTALL = "pip install 'quantstudy[peers]'"
MULTIPLE = 16  # torch._scaled_mm's: both dimensions of an FP8 product's weight
LABEL = "torchao "  # what a torchao engine's name starts with, its scales after it


class Peer(StrEnum):
    """A torchao float8 inference config (`--torchao`)."""

    DYNAMIC_ROW = "dynamic_row"
    DYNAMIC_TENSOR = "dynamic_tensor"
    STATIC_TENSOR = "static_tensor"

    @property
    def label(self) -> str:
        """The engine's name in records and tables."""
        return LABEL + SPECS[self].scales


@dataclass(frozen=True)
class PeerSpec:
    config: str  # torchao's config class
    granularity: Literal["PerRow", "PerTensor"]
    scales: str  # what the activation and weight scales are, in words
    static: bool  # calibrated activation scale (torchao's observers on the calibration images)
    convs: bool  # torchao quantizes conv2d weights under it
    cuda_only: bool  # torchao refuses to quantize with it on a CPU
    dtype: Literal["float16", "bfloat16"]  # the engine's dtype on CUDA (CPU: bfloat16)
    why_dtype: str = ""


SPECS: dict[Peer, PeerSpec] = {
    Peer.DYNAMIC_ROW: PeerSpec(
        "Float8DynamicActivationFloat8WeightConfig", "PerRow",
        "dynamic per-row", static=False, convs=False, cuda_only=True, dtype="bfloat16",
        why_dtype="torchao's per-row weights must be bfloat16",
    ),
    Peer.DYNAMIC_TENSOR: PeerSpec(
        "Float8DynamicActivationFloat8WeightConfig", "PerTensor",
        "dynamic per-tensor", static=False, convs=True, cuda_only=True, dtype="float16",
    ),
    Peer.STATIC_TENSOR: PeerSpec(
        "Float8StaticActivationFloat8WeightConfig", "PerTensor",
        "static per-tensor", static=True, convs=False, cuda_only=False, dtype="float16",
    ),
}  # fmt: skip


def parse_version(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version: "2.11.0+cu130" -> (2, 11, 0)."""
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def torchao_refusal(torchao: str | None, torch: str) -> str | None:
    """Why the installed torchao (None: absent) cannot run here beside `torch`; None if it can
    (the import itself is checked by the caller)."""
    if torchao is None:
        return f"torchao is not installed: {INSTALL} (torchao>={_dotted(TORCHAO_FLOOR)})"
    if parse_version(torchao) < TORCHAO_FLOOR:
        return (
            f"torchao {torchao} is older than {_dotted(TORCHAO_FLOOR)}, the first whose float8 "
            f"configs this bench drives: {INSTALL}"
        )
    if parse_version(torch) < TORCH_FLOOR:
        return (
            f"torchao {torchao} needs torch >= {_dotted(TORCH_FLOOR)} for its float8 kernels; "
            f"this is torch {torch}"
        )
    return None


def device_refusal(peer: Peer, device: str) -> str | None:
    """Why `peer` cannot be built on `device` ("cpu" or "cuda"); None if it can. A CUDA device
    has FP8 tensor cores (the study refuses one without them first)."""
    if device != "cuda" and SPECS[peer].cuda_only:
        return (
            "torchao's dynamic float8 configs quantize only on a CUDA GPU of compute capability "
            "8.9 or newer (it checks when it quantizes); this run is on the CPU"
        )
    return None


def peer_layers(
    peer: Peer, decisions: Sequence[LayerDecision], conv_fp8: bool
) -> tuple[list[str], dict[str, str]]:
    """(the selected layers `peer` runs in FP8, in order; layer -> why it stays in half
    precision). `conv_fp8`: torchao can run FP8 convs here (`mslk` and compute capability
    10.0 or newer)."""
    spec = SPECS[peer]
    taken: list[str] = []
    left: dict[str, str] = {}
    for d in decisions:
        why = _why_not(spec, d, conv_fp8)
        if why is None:
            taken.append(d.name)
        else:
            left[d.name] = why
    return taken, left


def _why_not(spec: PeerSpec, d: LayerDecision, conv_fp8: bool) -> str | None:
    if d.op == "conv2d":
        if not spec.convs:
            which = "static config" if spec.static else "per-row config"
            return f"torchao's {which} takes linear layers only"
        if d.groups != 1:
            return "torchao's FP8 conv takes groups=1 only"
        if not conv_fp8:
            return (
                "torchao's FP8 conv runs only through the mslk package on compute capability "
                "10.0 or newer (not here)"
            )
    if d.in_channels % MULTIPLE or d.out_channels % MULTIPLE:
        return (
            f"torchao leaves a layer of {d.in_channels} -> {d.out_channels} channels as it is "
            f"(FP8 products take multiples of {MULTIPLE})"
        )
    return None
