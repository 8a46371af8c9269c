"""FP8 modules are drop-in: model code that reads the replaced layer's attributes keeps working.

Every module that takes a float conv's or linear's place (`FP8Matmul`, `FusedFP8Matmul` on a
linear and on a 1x1 conv, `FusedFP8Conv2d`, `FusedFP8Depthwise` plain and "same"-padded, and the
emulation `QDQ`) answers the layer's attributes as the layer does, and its `weight` reports the
layer's shape, the module's device and the engine's dtype without holding or computing a copy
(`quant/layers/dropin.py` says why that, and not the FP8 or the dequantized weight).
"""

from __future__ import annotations

import copy

import pytest
import torch
from timm.layers import Conv2dSame
from torch import nn

from quantstudy.engines.size import weight_bytes
from quantstudy.quant.layers.dropin import CONV_ATTRS, LINEAR_ATTRS
from quantstudy.quant.layers.fused_conv import FusedFP8Conv2d
from quantstudy.quant.layers.fused_depthwise import FusedFP8Depthwise
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.matmul import QDQ, FP8Matmul
from quantstudy.quant.layers.spec import FP8LayerSpec

DTYPE = torch.bfloat16  # the CPU engines' half dtype; a float32 module would hide a wrong cast


def _layers() -> list[tuple[str, nn.Module, type]]:
    torch.manual_seed(0)
    return [
        ("linear/scaled_mm", nn.Linear(40, 24), FP8Matmul),
        ("linear/fused", nn.Linear(40, 24, bias=False), FusedFP8Matmul),
        ("1x1 conv s2/fused", nn.Conv2d(32, 48, 1, stride=2), FusedFP8Matmul),
        ("3x3 conv/fused", nn.Conv2d(16, 32, 3, stride=2, padding=1, dilation=1), FusedFP8Conv2d),
        ("depthwise/fused", nn.Conv2d(24, 24, 3, padding=1, groups=24), FusedFP8Depthwise),
        ("depthwise same/fused", Conv2dSame(24, 24, 5, stride=2, groups=24), FusedFP8Depthwise),
        ("linear/qdq", nn.Linear(40, 24), QDQ),
        ("3x3 conv/qdq", nn.Conv2d(16, 32, 3, padding=1), QDQ),
    ]


CASES = [pytest.param(layer, cls, id=name) for name, layer, cls in _layers()]


def _module(layer: nn.Module, cls: type) -> nn.Module:
    return cls(layer, FP8LayerSpec(0.05, True, DTYPE))


@pytest.mark.parametrize(("layer", "cls"), CASES)
def test_attributes_are_the_layers(layer: nn.Module, cls: type) -> None:
    module = _module(layer, cls)
    names = LINEAR_ATTRS if isinstance(layer, nn.Linear) else CONV_ATTRS
    for name in names:
        assert getattr(module, name) == getattr(layer, name), name
        assert type(getattr(module, name)) is type(getattr(layer, name)), name
    other = CONV_ATTRS if isinstance(layer, nn.Linear) else LINEAR_ATTRS
    for name in other:  # what the layer lacks, the module lacks: hasattr says so
        assert not hasattr(module, name), name
    assert (module.bias is None) == (layer.bias is None)


@pytest.mark.parametrize(("layer", "cls"), CASES)
def test_weight_reports_shape_device_and_engine_dtype(layer: nn.Module, cls: type) -> None:
    module = _module(layer, cls)
    w = module.weight
    assert isinstance(w, torch.Tensor)
    assert w.shape == layer.weight.shape and w.dim() == layer.weight.dim()
    assert w.dtype == DTYPE  # what the layer's weight reports in a bf16 engine, never FP8
    assert w.device == layer.weight.device


@pytest.mark.parametrize(("layer", "cls"), [c for c in CASES if c.values[1] is not QDQ])
def test_fp8_weight_view_holds_no_copy_and_refuses_writes(layer: nn.Module, cls: type) -> None:
    module = _module(layer, cls)
    a, b = module.weight, module.weight
    assert a.untyped_storage().nbytes() == a.element_size()  # one element, whatever the shape
    assert a.data_ptr() == b.data_ptr()  # the same element on every read: no work per read
    assert bool(a.isnan().all())  # not a weight: computing with it shows (module docstring)
    with pytest.raises(RuntimeError):
        a.add_(1.0)  # an expanded view: its elements share one memory location
    assert "_weight_probe" not in module.state_dict()  # no part of a checkpoint...
    twin = copy.deepcopy(module)
    del twin.__dict__["_weight_probe"]
    assert weight_bytes(module) == weight_bytes(twin)  # ...nor of the engine's weight bytes


def test_qdq_weight_is_the_weight_it_computes_with() -> None:
    layer = nn.Linear(40, 24)
    module = QDQ(layer, FP8LayerSpec(0.05, True, torch.float32))
    assert module.weight is module.inner.weight and module.bias is module.inner.bias
    x = torch.randn(3, 40)
    expected = nn.functional.linear(module.quantize_input(x), module.weight, module.bias)
    assert torch.equal(module(x), expected)


def test_to_moves_and_casts_the_weight_view() -> None:
    module = FusedFP8Matmul(nn.Linear(32, 16), FP8LayerSpec(0.05, True, DTYPE))
    assert module.to(torch.float32).weight.dtype == torch.float32  # as `.to` casts a weight
    assert module.to("meta").weight.device.type == "meta"


class _CastsToWeightDtype(nn.Module):
    """Model code of timm's kind (PositionalEncodingFourier, convit): builds a tensor on the
    layer's device in its dtype, then calls the layer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(32, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        pos = torch.linspace(0.0, 3.0, 32, device=w.device).to(w.dtype)
        return self.proj(x + pos[None, :, None, None])


def test_model_code_reading_the_weight_runs_and_feeds_the_engine_dtype() -> None:
    """The cast the model makes to `weight.dtype` feeds the FP8 module the engine's dtype, as it
    fed the float layer in an engine of that dtype: the outputs agree exactly with a module fed
    that input directly (an FP8 dtype there would have rounded the input without a scale)."""
    torch.manual_seed(0)
    model = _CastsToWeightDtype().to(DTYPE)
    fp8 = FusedFP8Matmul(model.proj.float(), FP8LayerSpec(0.05, True, DTYPE))
    model.proj = fp8
    x = torch.randn(2, 32, 4, 4).to(DTYPE)
    pos = torch.linspace(0.0, 3.0, 32).to(DTYPE)
    assert torch.equal(model(x), fp8(x + pos[None, :, None, None]))
