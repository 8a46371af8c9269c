"""Which GELU a layer computes: erf (timm's `nn.GELU`, our fused kernel's epilogue) or tanh
(cuBLASLt's GELU epilogue, `quant/cublaslt/problem.py: GELU_FORM`).

An engine's record names the form of every layer whose epilogue computes a GELU
(`FP8Layout.gelu`, from `gelu_forms` of the built engine), and the emulation computes that
form on that layer (`quant/plan/apply.py: apply_fake_quant`), so the engine against its
emulation stays exact and the quality against fp32 includes the forms' difference.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from quantstudy.record.vocab import Activation, GeluForm


def gelu_module(form: GeluForm) -> nn.GELU:
    """The float module that computes `form`."""
    return nn.GELU(approximate="tanh" if GeluForm(form) == GeluForm.TANH else "none")


def gelu_form_of(module: nn.Module) -> GeluForm:
    """The GELU the installed `module` computes, looking inside it: tanh where any part of it
    computes the tanh form (a layer whose `gelu_form` says so, as `LtFP8Matmul`'s, or an
    `nn.GELU(approximate="tanh")` run after it), else erf. A module that picks its kernel by
    batch (`engines/kernel_choice.py: ByBatch`) is tanh where any of its kernels is."""
    for part in module.modules():
        if getattr(part, "gelu_form", None) == GeluForm.TANH:
            return GeluForm.TANH
        if isinstance(part, nn.GELU) and part.approximate == "tanh":
            return GeluForm.TANH
    return GeluForm.ERF


def gelu_forms(model: nn.Module, epilogue: Mapping[str, str]) -> dict[str, GeluForm]:
    """layer -> the GELU it computes, for every layer of `epilogue` (layer -> the activation
    its FP8 epilogue computes, `FP8Layout.epilogue`) whose activation is GELU."""
    return {
        name: gelu_form_of(model.get_submodule(name))
        for name, act in sorted(epilogue.items())
        if act == Activation.GELU
    }
