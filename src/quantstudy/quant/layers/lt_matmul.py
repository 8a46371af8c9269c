"""A fused FP8 layer whose product runs in cuBLASLt with cuBLASLt's own epilogue.

`LtFP8Matmul` keeps `FusedFP8Matmul`'s quantization and state (the plan's FP8 weight and
per-channel scales, the static input scale, the bias, the absorbed activation, the FP8 hand-off,
the residual the rewrites move into it), so every engine rewrite that applies to a fused layer
applies to it, and replaces only the launch. What cuBLASLt computes differently, and why:
- GELU is cuBLASLt's tanh form, not timm's erf (`gelu_form`): a layer of it records "tanh"
  (`FP8Layout.gelu`), its emulation computes the same form, and off CUDA it computes it too,
  so the engine against its emulation stays exact. Under a recipe's `gelu: erf` the layer
  leaves GELU to the fused kernel (`lt_plan`).
- The per-channel scales and the static input scale are one alpha per output feature,
  w_scale[n] x_scale, folded once: cuBLASLt multiplies the float32 sum by it once, where the
  fused kernel multiplies by the two in turn (a float32 rounding apart).
- The bias goes in as the engine's 16-bit dtype, as cuBLASLt's FP8 bias epilogues require; the
  fused layer keeps the same values (the bias rounded to the engine's dtype) in float32.
- An FP8 output is the sum times 1 / the next layer's scale (cuBLASLt's D scale), where the
  fused kernel divides.
A layer whose epilogue cuBLASLt has no form for (`problem.epilogue_for`) runs the fused kernel;
`lt_answer` says which ran and why. Off CUDA a layer runs the fused kernel's torch arithmetic,
but where its plan runs cuBLASLt's GELU epilogue: that is computed as cuBLASLt does, tanh GELU of
the float32 sum and bias, rounded once at the write (`_tanh_reference`).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.quant.cublaslt.problem import (
    GELU_EPILOGUES,
    GELU_FORM,
    LT_NOTE_HEAD,
    LtEpilogue,
    epilogue_for,
)
from quantstudy.quant.formats.fp8 import to_fp8
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul, fp8_gemm
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.record.vocab import Activation, GeluForm, GeluPolicy

FUSED_FALLBACK = "fused kernel"


def lt_plan_of(layer: FusedFP8Matmul, erf_only: bool) -> tuple[LtEpilogue | None, str]:
    """cuBLASLt's epilogue for the fused layer `layer` as the rewrites left it, under a recipe
    that requires erf GELU or not, or None with why the fused kernel runs it: read from the
    layer's state alone, so a fused layer is asked before it is copied (`LtFP8Matmul.of_fused`)."""
    if layer.pair_scale is not None:
        return None, "a residual sum with an FP8 copy: two outputs"
    if layer.out_pad is not None:
        return None, "an output written inside the next conv's padding"
    if layer.row_scales or layer.k_pad:
        return None, "per-row input scales or a padded K"
    if layer.promote not in (0, 128):
        return None, f"products promoted every {layer.promote}: cuBLASLt sums fast or per K tile"
    residual = layer.res_act is not None
    act = Activation(layer.res_act) if residual and layer.res_act else Activation.NONE
    if act != Activation.NONE:
        return None, f"an activation ({act}) after the residual sum"
    fp8_out = layer.out_scale is not None
    return epilogue_for(True, Activation(layer.act), residual, fp8_out, erf_only)


class LtFP8Matmul(FusedFP8Matmul):
    """`FusedFP8Matmul` launched through cuBLASLt (module docstring)."""

    def __init__(self, layer: nn.Linear | nn.Conv2d, spec: FP8LayerSpec) -> None:
        super().__init__(layer, spec)
        self.erf_only = spec.gelu == GeluPolicy.ERF  # the recipe's `gelu: erf`

    @classmethod
    def of_fused(cls, fused: FusedFP8Matmul, gelu: GeluPolicy) -> LtFP8Matmul:
        """The fused layer `fused` as the engine's rewrites left it, launched through cuBLASLt
        under the recipe's `gelu`: a copy of its whole state (the FP8 weight and scales, the
        bias, the absorbed activation, the FP8 hand-offs, the residual sum and what follows
        it), so it has the fused layer's interface and computes its epilogue where `lt_plan`
        gives one. The hooks on `fused` are not copied (the kernel choice times its candidates
        from a pre-hook on the fused layer)."""
        lt = cls.__new__(cls)
        nn.Module.__init__(lt)
        hooks = {k for k in vars(lt) if "hook" in k}
        state = {k: v for k, v in vars(fused).items() if k not in hooks and k != "_lt_cache"}
        lt.__dict__.update(copy.deepcopy(state))
        lt.erf_only = GeluPolicy(gelu) == GeluPolicy.ERF
        return lt

    @property
    def gelu_form(self) -> GeluForm | None:
        """The GELU this layer computes: cuBLASLt's tanh form where its epilogue runs one, the
        fused kernel's erf where it falls back; None without a GELU."""
        if self.act != Activation.GELU:
            return None
        return GELU_FORM if self.lt_plan()[0] is not None else GeluForm.ERF

    def lt_plan(self) -> tuple[LtEpilogue | None, str]:
        """cuBLASLt's epilogue for this layer as the rewrites left it, or None with why the
        fused kernel runs it (`lt_plan_of`)."""
        return lt_plan_of(self, self.erf_only)

    @property
    def lt_answer(self) -> str:
        """What runs this layer's product, in words (the record's per-layer answer)."""
        epilogue, why = self.lt_plan()
        if epilogue is None:
            return f"{FUSED_FALLBACK}: {why}"
        return f"cuBLASLt {epilogue.value}" + (", fp8 out" if self.out_scale is not None else "")

    def _lt_operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The alpha vector, the 16-bit bias and the FP8 output's factor, made once per device."""
        cached = getattr(self, "_lt_cache", None)
        if cached is None or cached[0].device != self.w8.device:
            n = self.w8.shape[0]
            alpha = (self.w_scale.float() * self.x_scale.float()).contiguous()
            bias = self.bias if self.bias is not None else torch.zeros(n, device=self.w8.device)
            half = torch.bfloat16 if self.dtype == torch.bfloat16 else torch.float16
            d = None if self.out_scale is None else (1.0 / self.out_scale.float()).reshape(1)
            cached = (alpha, bias.to(half).contiguous(), d)
            self._lt_cache = cached
        return cached

    def _matmul(self, x2d: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        epilogue = self.lt_plan()[0]
        if x2d.device.type != "cuda" and epilogue in GELU_EPILOGUES:
            return self._tanh_reference(x2d)
        if epilogue is None or x2d.device.type != "cuda":
            return super()._matmul(x2d, residual)
        if (residual is None) != (self.res_act is None):
            raise ValueError("a residual layer takes its residual, and no other layer takes one")
        from quantstudy.quant.cublaslt.op import lt_linear

        xq, x_scale, _ = self._operand(x2d)
        alpha, bias, d_scale = self._lt_operands()
        c = residual.contiguous() if residual is not None else None
        return lt_linear(
            xq.contiguous(), self.w8, alpha, x_scale.reshape(1), bias, c, d_scale,
            epilogue.value, self.promote == 0, self.out_scale is not None, True,
        )  # fmt: skip

    def _tanh_reference(self, x2d: torch.Tensor) -> torch.Tensor:
        """Off CUDA, a GELU epilogue as cuBLASLt computes it: the float32 sum times the scales
        plus the bias, tanh GELU in float32, one rounding at the write (the FP8 output at the
        next layer's scale, or the engine's dtype)."""
        xq, x_scale, divisor = self._operand(x2d)
        y = fp8_gemm(
            xq, self.w8, self.w_scale, x_scale, self.bias, Activation.NONE, torch.float32,
            None, None, None, Activation.NONE, divisor, self.promote,
        )  # fmt: skip
        y = F.gelu(y, approximate="tanh")
        return to_fp8(y, self.out_scale) if self.out_scale is not None else y.to(self.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.lt_answer}"


def lt_note(model: torch.nn.Module) -> str | None:
    """ "cuBLASLt ran N layers' epilogues, the fused kernel m: name (why), ...", or None for a
    model without cuBLASLt layers. Which GELU each layer ran is the record's own field
    (`FP8Layout.gelu`, `gelu_forms`)."""
    plans = {n: m.lt_plan() for n, m in model.named_modules() if isinstance(m, LtFP8Matmul)}
    if not plans:
        return None
    ran = [n for n, (epilogue, _) in plans.items() if epilogue is not None]
    fell = [f"{n} ({why})" for n, (epilogue, why) in plans.items() if epilogue is None]
    note = f"{LT_NOTE_HEAD} {len(ran)} layers' epilogues"
    if fell:
        note += f", the fused kernel {len(fell)}: {', '.join(fell)}"
    return note
