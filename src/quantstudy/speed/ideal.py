"""The limit: the x an FP8 engine would reach if every selected layer ran at its FP8 roofline.

Why: a measured x alone cannot say whether FP8 is near what it allows on a model, since most
of an engine's time may be depthwise convs, attention or pointwise work that FP8 never touches.
The ideal FP8 engine here keeps everything the fp16 engine ran except the selected layers,
and runs each selected layer (its product, with bias and activation in the epilogue) at its
roofline: FP8 input read once, FP8 weight, fp16 output written once, at the GPU's dense FP8
rate and HBM bandwidth (`PEAKS`). Then

    ideal ms = fp16 ms - (products16 + elementwise16 - roofline8) / 1000,  ideal x = fp16 ms /
    ideal ms,

all from the study's own record:

- products16, the fp16 engine's kernel time on the selected layers' products: the fp16
  engine's dense product group minus the FP8 engine's (the layers left in fp16 run in both
  engines; the real FP8 layers' products moved to the FP8 group), both from one profiled call
  per engine (`speed/kernels.py`). Emulated layers (no FP8 kernel: quantize-dequantize around
  an fp16 op) and layers a `fastest` engine kept in fp16 (`engines/step_aside.py`) stay in the
  FP8 engine's dense group; their share of it is apportioned by fp16 roofline time among them
  and the unselected dense layers of the recipe's table. The ideal stays the recipe's: every
  selected layer at its FP8 roofline, whatever the engine chose for it.
- elementwise16, the bias/activation pass each selected layer's output goes through in the
  fp16 engine (Inductor keeps the bias off cuDNN's convolutions; cuBLAS applies a linear's
  bias itself, so a linear pays a pass only for an activation the fused engine absorbed):
  one read and one write of the output in fp16, at HBM bandwidth, capped at the fp16
  engine's "other" group. A lower bound on what the pass takes, so on this term the ideal is
  conservative.
- roofline8 per layer: max(bytes / bandwidth, 2 M K N / FP8 peak), no launch floor: at batch
  1 every layer is far under a kernel launch, so there the ideal is loose by design.

Layer shapes come from the recipe's table (`LayerDecision`): M = batch x output pixels (a
linear: batch x tokens), K = in channels x kernel area, N = out channels; output size
ceil(input / stride), the "same" padding of every kxk conv the built-in recipes select.
Selected depthwise convs (run on FP8 storage, `quant/layers/fused_depthwise.py`) are priced by bytes
alone (no tensor cores; their FLOPs are negligible): FP8 input and FP8 taps read once, fp16 output
written once, against their share of the fp16 engine's depthwise group (by fp16 bytes among
all the depthwise convs of the recipe's table), plus their bias/activation pass as
above. Grouped (not depthwise) layers are not priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantstudy.record import (
    BatchSpeed,
    EngineInfo,
    IdealSpeed,
    KernelBreakdown,
    LayerDecision,
    RecipeInfo,
    SpeedSection,
)
from quantstudy.record.vocab import Engine, KernelGroup


@dataclass(frozen=True)
class Peaks:
    """Dense tensor-core rates (no sparsity) and memory bandwidth of one GPU model."""

    fp8_tflops: float
    fp16_tflops: float
    hbm_tbs: float
    source: str

    def text(self, gpu: str) -> str:
        return (
            f"{gpu}: FP8 {self.fp8_tflops:g} and fp16 {self.fp16_tflops:g} TFLOP/s dense, "
            f"HBM {self.hbm_tbs:g} TB/s ({self.source})"
        )


# By a substring of the GPU's name as CUDA reports it, most specific first. The datasheets
# give sparse rates beside dense ones; these are the dense ones (half the sparse figure).
PEAKS: tuple[tuple[str, Peaks], ...] = (
    ("H200", Peaks(1979, 989, 4.8, "NVIDIA H200 Tensor Core GPU datasheet, SXM")),
    ("H100 NVL", Peaks(1671, 835, 3.9, "NVIDIA H100 datasheet, NVL")),
    ("H100 PCIe", Peaks(1513, 756, 2.0, "NVIDIA H100 datasheet, PCIe")),
    ("H100", Peaks(1979, 989, 3.35, "NVIDIA H100 datasheet, SXM")),
    ("L40S", Peaks(733, 362, 0.864, "NVIDIA L40S datasheet")),
    ("L4", Peaks(242.5, 121, 0.3, "NVIDIA L4 datasheet")),
)


def peaks_for(gpu_name: str) -> Peaks | None:
    """The table's entry for a GPU name ("NVIDIA H200", "cuda:0 (NVIDIA H200)"); None if the
    GPU is not in it (no FP8 tensor cores, or not tabulated)."""
    for key, peaks in PEAKS:
        if key.lower() in gpu_name.lower():
            return peaks
    return None


@dataclass(frozen=True)
class LayerCost:
    """One layer's matrix product at one batch size, and its byte and FLOP counts."""

    name: str
    m: int
    k: int
    n: int
    in_elems: int  # input map (or rows) elements, read once
    weight_elems: int
    is_conv: bool

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    def roofline_us(self, peaks: Peaks, in_bytes: int, w_bytes: int, tflops: float) -> float:
        data = self.in_elems * in_bytes + self.weight_elems * w_bytes + 2 * self.m * self.n
        return max(data / (peaks.hbm_tbs * 1e6), self.flops / (tflops * 1e6))

    def fp8_us(self, peaks: Peaks) -> float:
        return self.roofline_us(peaks, 1, 1, peaks.fp8_tflops)

    def fp16_us(self, peaks: Peaks) -> float:
        return self.roofline_us(peaks, 2, 2, peaks.fp16_tflops)

    def pass_us(self, peaks: Peaks) -> float:
        """A separate elementwise pass over the output: fp16 read and write."""
        return 4 * self.m * self.n / (peaks.hbm_tbs * 1e6)


def layer_cost(d: LayerDecision, batch: int) -> LayerCost | None:
    """The product of a dense conv or linear at `batch`; None for grouped layers and layers the
    example pass did not run (no input size)."""
    if d.groups != 1 or d.input_hw is None:
        return None
    h, w = d.input_hw
    if d.op == "linear":
        m = batch * h * w
        return LayerCost(d.name, m, d.in_channels, d.out_channels, m * d.in_channels,
                         d.in_channels * d.out_channels, False)  # fmt: skip
    kh, kw = d.kernel or (1, 1)
    sh, sw = d.stride or (1, 1)
    m = batch * math.ceil(h / sh) * math.ceil(w / sw)
    k = d.in_channels * kh * kw
    # A strided 1x1 conv reads only the pixels it keeps; a kxk conv reads its whole map once.
    read = m * d.in_channels if (kh, kw) == (1, 1) else batch * h * w * d.in_channels
    return LayerCost(d.name, m, k, d.out_channels, read, k * d.out_channels, True)


@dataclass(frozen=True)
class _Depthwise:
    """Element counts of one depthwise conv at one batch: input, weight taps, output."""

    inputs: int
    taps: int
    outputs: int

    def bytes(self, storage: int) -> int:
        """Bytes moved with input and taps at `storage` bytes each (2: fp16 engine, 1: FP8
        storage) and the fp16 output written once."""
        return storage * (self.inputs + self.taps) + 2 * self.outputs


def _depthwise(d: LayerDecision, batch: int) -> _Depthwise | None:
    """The depthwise conv `d` at `batch`; None for other layers and layers the example pass
    did not run."""
    if d.groups <= 1 or not (d.groups == d.in_channels == d.out_channels) or not d.input_hw:
        return None
    h, w = d.input_hw
    kh, kw = d.kernel or (1, 1)
    sh, sw = d.stride or (1, 1)
    out = batch * math.ceil(h / sh) * math.ceil(w / sw) * d.out_channels
    return _Depthwise(batch * h * w * d.in_channels, d.groups * kh * kw, out)


def _depthwise_terms(
    recipe: RecipeInfo, fp16: KernelBreakdown, batch: int, peaks: Peaks
) -> tuple[int, float, float, float]:
    """(how many selected depthwise convs are priced, the fp16 engine's time on them, their
    FP8-storage roofline, their bias/activation passes), times in us; zeros when the recipe
    selects none."""
    chosen = [c for c in (_depthwise(d, batch) for d in recipe.selected) if c is not None]
    if not chosen:
        return 0, 0.0, 0.0, 0.0
    others = [c for c in (_depthwise(d, batch) for d in recipe.excluded) if c is not None]
    share = sum(c.bytes(2) for c in chosen) / sum(c.bytes(2) for c in chosen + others)
    bw = peaks.hbm_tbs * 1e6
    roof8 = sum(c.bytes(1) for c in chosen) / bw
    passes = sum(4 * c.outputs for c in chosen) / bw
    return len(chosen), _group(fp16, KernelGroup.DEPTHWISE_CONV) * share, roof8, passes


def _group(b: KernelBreakdown, group: KernelGroup) -> float:
    return next((g.time_us for g in b.groups if g.group == group), 0.0)


def ideal_for_batch(
    bs: BatchSpeed,
    fp16: KernelBreakdown,
    fp8: KernelBreakdown,
    recipe: RecipeInfo,
    engine: EngineInfo,
    peaks: Peaks,
    gpu: str,
) -> IdealSpeed | None:
    """The ideal of one batch size (module docstring); None where no selected layer is priced."""
    batch = bs.batch
    costs = {d.name: layer_cost(d, batch) for d in recipe.selected}
    priced = {name: c for name, c in costs.items() if c is not None}
    n_dw, dw16, dw8, dw_passes = _depthwise_terms(recipe, fp16, batch, peaks)
    if not priced and not dw16:
        return None
    mm16 = _group(fp16, KernelGroup.FP16_MATMUL_CONV)
    mm8 = _group(fp8, KernelGroup.FP16_MATMUL_CONV)
    products = max(0.0, mm16 - mm8)
    # selected layers whose fp16 product stays in the FP8 engine's dense group: emulated, or
    # kept in fp16 by the fastest choice
    in_fp16 = [*engine.fp8_emulated, *engine.layout.stepped_aside]
    still16 = [priced[n] for n in in_fp16 if n in priced]
    if still16:
        rest = [layer_cost(d, batch) for d in recipe.excluded]
        still16_us = sum(c.fp16_us(peaks) for c in still16)
        rest16 = sum(c.fp16_us(peaks) for c in rest if c is not None)
        products += mm8 * still16_us / (still16_us + rest16)
    passes = sum(
        c.pass_us(peaks) for c in priced.values() if c.is_conv or c.name in engine.layout.epilogue
    )
    elementwise = min(passes + dw_passes, _group(fp16, KernelGroup.OTHER))
    products += dw16
    roof8 = sum(c.fp8_us(peaks) for c in priced.values()) + dw8
    fp16_ms = bs.fp16_ms.median
    ideal_ms = fp16_ms - (products + elementwise - roof8) / 1000
    if ideal_ms <= 0:
        return None
    ideal_x = fp16_ms / ideal_ms
    return IdealSpeed(
        batch=batch,
        peaks=peaks.text(gpu),
        layers=len(priced) + n_dw,
        fp16_products_us=products,
        fp16_elementwise_us=elementwise,
        fp8_roofline_us=roof8,
        fp16_ms=fp16_ms,
        ideal_x=ideal_x,
        measured_x=bs.ratio.median,
        fraction=bs.ratio.median / ideal_x,
    )


def ideal_speed(
    speed: SpeedSection, recipe: RecipeInfo | None, engines: list[EngineInfo], gpu: str | None
) -> tuple[list[IdealSpeed] | None, str | None]:
    """(the ideal per batch size, None) or (None, why it was not computed)."""
    if not speed.meaningful or not speed.kernels:
        return None, "ideal x (needs GPU timings and their kernel profiles)"
    peaks = peaks_for(gpu or speed.device)
    if peaks is None:
        return None, f"ideal x (no FP8 peaks tabulated for {gpu or speed.device})"
    engine = next((e for e in engines if e.name == Engine.FP8), None)
    if recipe is None or engine is None:
        return None, "ideal x (needs the recipe's layer table and the FP8 engine)"
    found = []
    for bs in speed.batches:
        profiles = {k.engine: k for k in speed.kernels if k.batch == bs.batch}
        if {Engine.FP16, Engine.FP8} <= profiles.keys():
            one = ideal_for_batch(
                bs,
                profiles[Engine.FP16],
                profiles[Engine.FP8],
                recipe,
                engine,
                peaks,
                gpu or speed.device,
            )
            found += [one] if one is not None else []
    if not found:
        return None, "ideal x (no batch with both engines' kernel profiles and a priced layer)"
    return found, None
