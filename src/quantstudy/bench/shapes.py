"""The layers a product benchmark times, found on the CPU from one traced pass (random weights:
only shapes matter): a recipe's FP8 products as M x K x N, a model's depthwise convs."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from quantstudy.gpu.timer import time_ms
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.graph.trace import input_shapes
from quantstudy.quant.layers.matmul import real_fp8_blocker
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve

# The GPU whose datasheet bandwidth the rooflines of a `--shapes-only` listing use: the one the
# committed product records were timed on (no GPU is there to measure).
SHAPES_ONLY_GPU = "H200"
COPY_BYTES = 1 << 30  # the buffer `copy_bandwidth` copies: far beyond any cache


def roofline_bandwidth(device: torch.device) -> float:
    """Bytes/s of the rooflines (a lower bound on time): on a GPU, its device-to-device copy
    bandwidth measured there and then, the rate a memory-bound kernel can reach (below the
    datasheet's HBM rate); elsewhere the datasheet HBM rate of `SHAPES_ONLY_GPU`."""
    if device.type == "cuda":
        return copy_bandwidth(device)
    from quantstudy.speed.ideal import peaks_for

    peaks = peaks_for(SHAPES_ONLY_GPU)
    assert peaks is not None, f"{SHAPES_ONLY_GPU} is in speed/ideal.py's PEAKS"
    return peaks.hbm_tbs * 1e12


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read and written per second by a copy of `COPY_BYTES` on `device`, timed by the
    kernel timer (`gpu/timer.py`: the mean of CUDA-graph replays of about 50 ms of copies)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), rep=50, stat="mean")
    return 2 * COPY_BYTES / (ms * 1e-3)


@dataclass
class Product:
    """One unique FP8 matrix product of a recipe and the layers that run it."""

    m: int
    k: int
    n: int
    conv_map: list[int] | None  # [batch, K, H, W]: a stride-1 1x1 conv, timed as a conv too
    layers: list[str] = field(default_factory=list)

    @property
    def fused_bytes(self) -> int:
        """FP8 input and weight read, fp16 output written: what the fused kernel must move."""
        return self.m * self.k + self.n * self.k + 2 * self.m * self.n


@dataclass
class DepthwiseConv:
    """One unique depthwise conv (channels, kernel, stride, input map) and its layers."""

    c: int
    k: int
    stride: int
    input: list[int]
    output: list[int]
    pad: list[int]  # top, left
    module: nn.Conv2d
    layers: list[str] = field(default_factory=list)

    def moved_bytes(self, x_bytes: int, y_bytes: int) -> int:
        return math.prod(self.input) * x_bytes + math.prod(self.output) * y_bytes


def traced_model(model_name: str) -> tuple[nn.Module, torch.Tensor]:
    """The model with random weights and a zero image of its input size."""
    model = load_model(model_name, "random").model.eval()
    return model, torch.zeros(1, *resolve_preprocessing(model).input_size)


@functools.lru_cache(maxsize=1)
def _recipe_layers(
    model_name: str, recipe_name: str | None
) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """The model (random weights), its example input and the recipe's selected layers. Kept for
    the next call: `bench products` asks for one model's linears and kxk convs at each batch in
    turn, and its callers only read the model."""
    model, example = traced_model(model_name)
    recipe, _ = load_recipe(recipe_name or default_recipe_for(model_name))
    return model, example, [d.name for d in resolve(recipe, model, example).selected]


def fp8_products(model_name: str, recipe_name: str | None, batch: int) -> list[Product]:
    """The unique products of the recipe's layers that run a real FP8 product, at `batch`."""
    model, example, chosen = _recipe_layers(model_name, recipe_name)
    real = [n for n in chosen if real_fp8_blocker(model.get_submodule(n)) is None]
    shapes = input_shapes(model, example, real)
    out: dict[tuple[int, int, int, bool], Product] = {}
    for name in real:
        layer = model.get_submodule(name)
        shape = shapes[name]
        if isinstance(layer, nn.Conv2d):
            (sh, sw), (h, w) = layer.stride, shape[2:]
            ho, wo = -(-h // sh), -(-w // sw)
            stride1 = (sh, sw) == (1, 1)
            key = (batch * ho * wo, layer.in_channels, layer.out_channels, stride1)
            conv_map = [batch, layer.in_channels, ho, wo] if stride1 else None
        else:  # a linear layer over (batch, tokens..., features)
            key = (batch * math.prod(shape[1:-1]), layer.in_features, layer.out_features, False)
            conv_map = None
        out.setdefault(key, Product(key[0], key[1], key[2], conv_map)).layers.append(name)
    return list(out.values())


@dataclass
class ConvProduct:
    """One unique kxk FP8 conv of a recipe (the implicit-GEMM kernel's launch) and its layers."""

    batch: int
    c: int
    n: int
    h: int
    w: int
    kh: int
    kw: int
    stride: int
    pad: int
    layers: list[str] = field(default_factory=list)

    @property
    def gemm(self) -> tuple[int, int, int]:
        """Its implicit GEMM's M, K, N."""
        ho = (self.h + 2 * self.pad - self.kh) // self.stride + 1
        wo = (self.w + 2 * self.pad - self.kw) // self.stride + 1
        return self.batch * ho * wo, self.c * self.kh * self.kw, self.n


def kxk_products(model_name: str, recipe_name: str | None, batch: int) -> list[ConvProduct]:
    """The unique kxk convs of the recipe's layers that the fused FP8 conv runs (one stride and
    one padding for both axes), at `batch`."""
    from quantstudy.quant.layers.fused_conv import kxk_fp8_blocker

    model, example, chosen = _recipe_layers(model_name, recipe_name)

    def runs(name: str) -> bool:
        layer = model.get_submodule(name)
        return (
            isinstance(layer, nn.Conv2d)
            and layer.kernel_size != (1, 1)
            and kxk_fp8_blocker(layer) is None
            and len(set(layer.stride)) == 1
            and len(set(layer.padding)) == 1
            and layer.dilation == (1, 1)
        )

    names = [n for n in chosen if runs(n)]
    shapes = input_shapes(model, example, names)
    out: dict[tuple[int, ...], ConvProduct] = {}
    for name in names:
        conv = model.get_submodule(name)
        _, c, h, w = shapes[name]
        (kh, kw), s, p = conv.kernel_size, conv.stride[0], int(conv.padding[0])
        key = (c, conv.out_channels, h, w, kh, kw, s, p)
        out.setdefault(key, ConvProduct(batch, *key)).layers.append(name)
    return list(out.values())


def is_depthwise(m: nn.Module) -> bool:
    return isinstance(m, nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


def depthwise_convs(model_name: str, batch: int) -> tuple[list[DepthwiseConv], list[str]]:
    """The model's unique depthwise convs at `batch`, and the names of those the Triton kernel
    cannot run (one stride for both axes, no dilation, symmetric or "same" padding)."""
    from timm.layers.padding import get_same_padding

    model, example = traced_model(model_name)
    names = [n for n, m in model.named_modules() if is_depthwise(m)]
    shapes = input_shapes(model, example, names)
    rows: dict[tuple[int, ...], DepthwiseConv] = {}
    skipped = []
    for name in names:
        conv = model.get_submodule(name)
        _, c, h, w = shapes[name]
        (k, _), (s, s_w) = conv.kernel_size, conv.stride
        same = isinstance(conv.padding, str) or type(conv).__name__ == "Conv2dSame"
        if s != s_w or conv.dilation != (1, 1) or (not same and len(set(conv.padding)) > 1):
            skipped.append(name)
            continue
        if same:
            ho, wo = -(-h // s), -(-w // s)
            pad = [get_same_padding(h, k, s, 1) // 2, get_same_padding(w, k, s, 1) // 2]
        else:
            p = conv.padding[0]
            ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            pad = [p, p]
        key = (c, k, s, h, w)
        row = rows.setdefault(
            key, DepthwiseConv(c, k, s, [batch, c, h, w], [batch, c, ho, wo], pad, conv)
        )
        row.layers.append(name)
    return list(rows.values()), skipped
