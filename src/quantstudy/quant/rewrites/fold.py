"""BatchNorm folding into the preceding convolution, with eval statistics.

The seed studies scale FP8 weights from the folded kernel (as TensorRT does), so folding comes
before weight quantization. Pairs are found by running the model once: a BatchNorm whose input is
exactly the tensor a convolution just produced is folded into that convolution. timm's
`BatchNormAct2d` keeps its activation (and drop) after folding.
"""

from __future__ import annotations

import torch
from torch import nn

from quantstudy.quant.graph.trace import tensor_links

_NORMS = (nn.BatchNorm2d,)


def _foldable(module: nn.Module) -> bool:
    """Only convs whose forward uses their weight as is: folding into timm's `StdConv2d` (which
    standardizes its weight in forward) would be undone by the standardization."""
    from timm.layers import Conv2dSame

    return type(module) in (nn.Conv2d, Conv2dSame)


def find_conv_bn_pairs(model: nn.Module, example: torch.Tensor) -> list[tuple[str, str]]:
    """(conv name, bn name) pairs where the BN consumes exactly the conv's output tensor."""
    modules = list(model.named_modules())
    convs = [name for name, mod in modules if _foldable(mod)]
    norms = [name for name, mod in modules if isinstance(mod, _NORMS)]
    pairs, _ = tensor_links(model, example, convs, norms)
    return pairs


def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    """Fold `bn` (eval statistics) into `conv` in place: W' = W*g/s, b' = (b-mu)*g/s + beta."""
    with torch.no_grad():
        std = torch.sqrt(bn.running_var.double() + bn.eps)
        gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(std)
        beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(std)
        factor = gamma / std
        w = conv.weight.double() * factor.reshape(-1, 1, 1, 1)
        b = conv.bias.double() if conv.bias is not None else torch.zeros_like(std)
        b = (b - bn.running_mean.double()) * factor + beta
        conv.weight.copy_(w.to(conv.weight.dtype))
        if conv.bias is None:
            conv.bias = nn.Parameter(b.to(conv.weight.dtype))
        else:
            conv.bias.copy_(b.to(conv.bias.dtype))


def _after_bn(bn: nn.Module) -> nn.Module:
    """What remains of a norm layer once its affine part is folded away."""
    act = getattr(bn, "act", None)
    drop = getattr(bn, "drop", None)
    rest = [m for m in (drop, act) if m is not None and not isinstance(m, nn.Identity)]
    if not rest:
        return nn.Identity()
    return rest[0] if len(rest) == 1 else nn.Sequential(*rest)


def fold_batchnorm(model: nn.Module, example: torch.Tensor) -> list[tuple[str, str]]:
    """Fold every conv->BN pair of `model` in place; returns the folded pairs."""
    pairs = find_conv_bn_pairs(model, example)
    for conv_name, bn_name in pairs:
        conv = model.get_submodule(conv_name)
        bn = model.get_submodule(bn_name)
        fold_conv_bn(conv, bn)
        parent_name, _, child = bn_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _after_bn(bn))
    return pairs
