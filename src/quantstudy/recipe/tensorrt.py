"""Pre-screen of a resolved recipe for TensorRT: selected layers TensorRT will not run in FP8.

A recipe is written for quantstudy's engines; TensorRT places FP8 itself from the Q/DQ graph and
keeps a layer in fp16 where it has no FP8 kernel, so the same recipe can time differently there.
Each rule names its source. `import-trt` then reports which layers TensorRT really ran in FP8
(`SpeedSection.layer_precision`); this screen is the prediction made before any build.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantstudy.record import LayerDecision

RN_10_3 = (
    "TensorRT 10.3.0 release notes (FP8 convolution on Ada, with Hopper's limitations): "
    "https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/release-notes-10/"
    "10.3.0.html"
)
MAX_KERNEL = 32
CHANNEL_ALIGN = 16


@dataclass(frozen=True)
class Flag:
    layer: str
    reason: str
    source: str


def _reasons(d: LayerDecision) -> list[tuple[str, str]]:
    found = []
    if d.op == "conv2d" and d.groups > 1:
        kind = "depthwise" if d.groups == d.in_channels else f"grouped ({d.groups} groups)"
        found.append(
            (f"{kind} conv: TensorRT has no optimized FP8 kernels for grouped or depthwise "
             "convolutions (INT8 is its advice there)", RN_10_3)
        )  # fmt: skip
    if d.kernel is not None and max(d.kernel) > MAX_KERNEL:
        found.append(
            (f"kernel {d.kernel[0]}x{d.kernel[1]} is larger than {MAX_KERNEL}x{MAX_KERNEL}, "
             "beyond TensorRT's FP8 convolutions", "a limit assumed here, not found in "
             "TensorRT's own pages")
        )  # fmt: skip
    small = [c for c in (d.in_channels, d.out_channels) if c % CHANNEL_ALIGN]
    if small:
        found.append(
            (f"{d.in_channels} -> {d.out_channels} channels: not a multiple of "
             f"{CHANNEL_ALIGN}, the FP8 tensor cores' channel vector; expect padding or an fp16 "
             "fallback", "FP8 MMA alignment (16 bytes, as `quant/layers/matmul.py` ALIGN); "
             "TensorRT's own limit not verified here")
        )  # fmt: skip
    return found


def prescreen(selected: list[LayerDecision]) -> list[Flag]:
    """Every selected layer TensorRT is expected not to run (well) in FP8, with the reason."""
    return [Flag(d.name, reason, source) for d in selected for reason, source in _reasons(d)]


def prescreen_lines(selected: list[LayerDecision]) -> list[str]:
    flags = prescreen(selected)
    if not flags:
        return [f"TensorRT pre-screen: no flag on the {len(selected)} selected layers."]
    lines = [
        f"TensorRT pre-screen: {len({f.layer for f in flags})} of {len(selected)} selected "
        "layers may not run in FP8 under TensorRT:"
    ]
    lines += [f"  - {f.layer}: {f.reason} [{f.source}]" for f in flags]
    return lines
