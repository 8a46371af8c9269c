"""Fused FP8 layers that write their output already zero-padded for the conv that reads it.

TensorFlow-ported timm models (tf_efficientnet*, tf_mixnet*, tf_mobilenetv3*) pad the input of
every strided conv at run time (`Conv2dSame`: `F.pad`, then the conv without padding). After an
fp16 conv Inductor fuses that pad into the bias/activation pass it runs anyway; after a fused
FP8 layer, whose epilogue already applied bias and activation inside one opaque kernel, the pad
is a pass of its own over the network's widest tensors (docs/fp8-kernel.md measures its share
of the FP8 engine's time).
Here the producer's epilogue writes the interior of the padded buffer (`quant/layers/padding.py`,
the kernel's MAP_OUT) and the conv reads it with no padding of its own: the same values, one
pass fewer.

Layer P pads for module C when C's input is exactly P's output (after the activation P
absorbed), each is called once, C is a `Conv2dSame` or a zero `nn.ZeroPad2d`/`nn.ConstantPad2d`,
and nothing else reads P's output (checked as FP8 hand-offs are: `handoff.marked_readers`). P is
a fused 1x1 conv that writes no FP8 copy, hand-off or residual sum (those write other buffers).
"""

from __future__ import annotations

import torch
from torch import nn

from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.graph.trace import tensor_links
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.quant.layers.padding import OutputPad
from quantstudy.quant.rewrites.absorb import exact_subset, with_absorbed
from quantstudy.quant.rewrites.handoff import marked_readers


def padding_of(module: nn.Module) -> OutputPad | None:
    """The zero padding `module` applies to its input before anything else, or None."""
    try:
        from timm.layers.conv2d_same import Conv2dSame
    except ImportError:  # pragma: no cover - timm is a dependency
        Conv2dSame = ()
    if Conv2dSame and type(module) is Conv2dSame:
        return OutputPad(
            kernel=tuple(module.weight.shape[-2:]),
            stride=tuple(module.stride),
            dilation=tuple(module.dilation),
        )
    if type(module) in (nn.ZeroPad2d, nn.ConstantPad2d) and module.value == 0:
        return OutputPad(fixed=tuple(module.padding))
    return None


def _unpadded(module: nn.Module) -> nn.Module:
    """What `module` does once its input arrives padded: the conv with no padding, or nothing."""
    if not isinstance(module, nn.Conv2d):
        return nn.Identity()
    conv = nn.Conv2d(
        module.in_channels, module.out_channels, module.kernel_size, module.stride, 0,
        module.dilation, module.groups, module.bias is not None,
        device=module.weight.device, dtype=module.weight.dtype,
    )  # fmt: skip
    conv.load_state_dict(module.state_dict())
    return conv


def can_pad(layer: nn.Module) -> bool:
    """A fused 1x1 conv whose output is its own: no FP8 write, FP8 copy or residual sum."""
    return (
        isinstance(layer, FusedFP8Matmul)
        and layer.is_conv
        and layer.out_scale is None
        and layer.pair_scale is None
        and layer.res_act is None
    )


def padded_outputs(
    engine: nn.Module,
    source: nn.Module,
    layers: list[str],
    example: torch.Tensor,
    absorbed: dict[str, tuple[str, str]],
) -> dict[str, str]:
    """producer -> padding consumer in the `engine` built from the float `source`: producers
    among `layers` that `can_pad` there, consumers that pad alike in both (a reader the plan
    made an FP8 layer applies its own padding), `absorbed` the activations moved into the
    producers' epilogues; checked as the module docstring says."""
    writers = [n for n in layers if can_pad(engine.get_submodule(n))]
    base = with_absorbed(source, {layer: act for layer, (act, _) in absorbed.items()})
    pads = [
        n
        for n, m in base.named_modules()
        if padding_of(m) is not None and padding_of(engine.get_submodule(n)) == padding_of(m)
    ]
    links, calls = tensor_links(base, example, writers, [*writers, *pads])  # calls of both
    taken: set[str] = set()
    candidates = {}
    for p, c in links:
        if c not in pads or calls[p] != 1 or calls[c] != 1:
            continue
        if p not in candidates and c not in taken:
            candidates[p] = c
            taken.add(c)
    return exact_subset(base, example, candidates, marked_readers)


def fuse_padded(model: nn.Module, source: nn.Module, pairs: dict[str, str]) -> None:
    """In the engine `model`, each producer of `pairs` writes its consumer's padding (from the
    float `source`'s module) and the consumer pads no more (in place)."""
    for p, c in pairs.items():
        layer = model.get_submodule(p)
        if not can_pad(layer):
            raise ValueError(f"{p} cannot write a padded output: {type(layer).__name__}")
        pad = padding_of(source.get_submodule(c))
        reader = model.get_submodule(c)
        if pad is None or padding_of(reader) != pad:
            raise ValueError(f"{c} is not the same zero padding here: {type(reader).__name__}")
        layer.out_pad = pad
        replace_module(model, c, _unpadded(model.get_submodule(c)))
