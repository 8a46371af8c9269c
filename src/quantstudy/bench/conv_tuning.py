"""The CPU side of the conv tuning check (`tools/lab/gpu/conv_tuning_check.py`, which launches
them on the GPU machine): the distinct dense kxk and depthwise convs of a model as the FP8 engine
launches them, and the comparison of the check's cold and warm phases. Here, not in the lab
script, so both are checked on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from quantstudy.quant.kernels.layout import same_padding


@dataclass(frozen=True)
class Conv:
    """One conv as the engine launches it (channels padded to 16 for the kxk kernel)."""

    depthwise: bool
    cin: int
    cout: int
    hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]  # top/left
    dilation: tuple[int, int]
    out: tuple[int, int]


def model_convs(name: str) -> list[Conv]:
    """The distinct dense kxk (groups 1, kernel > 1x1) and depthwise convs of timm's `name`."""
    import timm
    from timm.layers import Conv2dSame

    model = timm.create_model(name, pretrained=False).eval()
    found: list[Conv] = []

    def hook(mod: torch.nn.Conv2d, inputs: tuple[torch.Tensor], out: torch.Tensor) -> None:
        depthwise = mod.groups == mod.in_channels == mod.out_channels > 1
        if not depthwise and (mod.groups != 1 or mod.kernel_size == (1, 1)):
            return
        h, w = inputs[0].shape[2:]
        pad = mod.padding
        if isinstance(mod, Conv2dSame):
            pad = tuple(same_padding(n, k, s)[1] for n, k, s in
                        zip((h, w), mod.kernel_size, mod.stride, strict=True))  # fmt: skip
        cin = mod.in_channels if depthwise else -(-mod.in_channels // 16) * 16
        conv = Conv(depthwise, cin, mod.out_channels, (h, w), mod.kernel_size, mod.stride,
                    pad, mod.dilation, tuple(out.shape[2:]))  # fmt: skip
        if conv not in found:
            found.append(conv)

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(1, *model.pretrained_cfg.get("input_size", (3, 224, 224))))
    return found


def compare_phases(phases: dict[str, Any]) -> bool:
    """Marks each warm run equal to its cold one or not; prints a line per model, batch and
    phase, and one per model and phase over its batches; whether every check held."""
    ok = True
    totals: dict[str, dict[str, float]] = {}
    for key, cold in phases["cold"]["runs"].items():
        warm = phases["warm"]["runs"][key]
        warm["cold_equal"] = warm["digests"] == cold["digests"]
        checks = ("untimed_equal", "every_kept_tile_equal", "stored_equal")
        ok &= warm["cold_equal"] and all(cold[c] for c in checks)
        for name, run in (("cold", cold), ("warm", warm)):
            tuned = run["tuning"].values()
            launches = sum(t["launches"] for t in tuned)
            configs = sum(t["configs"] for t in tuned)
            print(f"{key} {name}: {launches:.0f} launches tuned, {configs:.0f} configs compiled, "
                  f"first pass {run['first_pass_s']:.1f} s ({run['layers']} layers)")  # fmt: skip
            total = totals.setdefault(f"{key.split()[0]} {name}", {"n": 0, "m": 0, "s": 0.0})
            total["n"] += launches
            total["m"] += configs
            total["s"] += run["first_pass_s"] + run.get("untimed_pass_s", 0.0)
    for key, t in totals.items():
        print(f"{key}: {t['n']:.0f} launches, {t['m']:.0f} configs compiled, {t['s']:.1f} s "
              "(first passes, untimed and tuned)", flush=True)  # fmt: skip
    return ok
