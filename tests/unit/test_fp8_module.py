"""`fp8_module`: the one choice of the FP8 module for a layer, shared by engines and timing."""

import torch
from torch import nn

from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.matmul import QDQ, FP8Matmul
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import fp8_module

LAYERS = {
    "pointwise": nn.Conv2d(32, 64, 1),
    "dense 3x3": nn.Conv2d(32, 64, 3, padding=1),
    "depthwise": nn.Conv2d(32, 32, 3, padding=1, groups=32),
    "grouped": nn.Conv2d(32, 32, 3, padding=1, groups=4),
    "linear": nn.Linear(64, 32),
}


def _kinds(kernel: str) -> dict[str, tuple[type, bool]]:
    out = {}
    for name, layer in LAYERS.items():
        module, blocker = fp8_module(layer, FP8LayerSpec(0.01, True, torch.float16), kernel)
        out[name] = (type(module), blocker is None)
    return out


def test_fused_kernel_takes_pointwise_dense_depthwise_and_linear_layers():
    assert _kinds("fused") == {
        "pointwise": (FusedFP8Matmul, True),
        "dense 3x3": (FusedFP8Conv2d, True),
        "depthwise": (FusedFP8Depthwise, True),
        "grouped": (QDQ, False),
        "linear": (FusedFP8Matmul, True),
    }


def test_scaled_mm_has_no_conv_beyond_1x1():
    assert _kinds("scaled_mm") == {
        "pointwise": (FP8Matmul, True),
        "dense 3x3": (QDQ, False),
        "depthwise": (QDQ, False),
        "grouped": (QDQ, False),
        "linear": (FP8Matmul, True),
    }


def test_emulated_layer_says_why():
    _, blocker = fp8_module(LAYERS["grouped"], FP8LayerSpec(0.01, True, torch.float16), "fused")
    assert blocker == "kernel 3x3 has no FP8 conv kernel"
