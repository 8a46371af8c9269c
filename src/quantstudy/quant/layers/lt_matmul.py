"""A fused FP8 layer whose product runs in cuBLASLt with cuBLASLt's own epilogue.

`LtFP8Matmul` keeps `FusedFP8Matmul`'s quantization and state (the plan's FP8 weight and
per-channel scales, the static input scale, the bias, the absorbed activation, the FP8 hand-off,
the residual the rewrites move into it), so every engine rewrite that applies to a fused layer
applies to it, and replaces only the launch. What cuBLASLt computes differently, and why:
- GELU is cuBLASLt's tanh form, not timm's erf (`gelu_form`): a layer of it records "tanh".
- The per-channel scales and the static input scale are one alpha per output feature,
  w_scale[n] x_scale, folded once: cuBLASLt multiplies the float32 sum by it once, where the
  fused kernel multiplies by the two in turn (a float32 rounding apart).
- The bias goes in as the engine's 16-bit dtype, as cuBLASLt's FP8 bias epilogues require; the
  fused layer keeps the same values (the bias rounded to the engine's dtype) in float32.
- An FP8 output is the sum times 1 / the next layer's scale (cuBLASLt's D scale), where the
  fused kernel divides.
A layer whose epilogue cuBLASLt has no form for (`problem.epilogue_for`), or off CUDA, runs the
fused kernel; `lt_answer` says which ran and why.
"""

from __future__ import annotations

import torch

from quantstudy.quant.cublaslt.problem import GELU_FORM, LT_NOTE_HEAD, LtEpilogue, epilogue_for
from quantstudy.quant.layers.fused_matmul import FusedFP8Matmul
from quantstudy.record.vocab import Activation

FUSED_FALLBACK = "fused kernel"


class LtFP8Matmul(FusedFP8Matmul):
    """`FusedFP8Matmul` launched through cuBLASLt (module docstring)."""

    @property
    def gelu_form(self) -> str | None:
        """The GELU this layer computes: cuBLASLt's tanh form where its epilogue runs one, the
        fused kernel's erf where it falls back; None without a GELU."""
        if self.act != Activation.GELU:
            return None
        return GELU_FORM if self.lt_plan()[0] is not None else "erf"

    def lt_plan(self) -> tuple[LtEpilogue | None, str]:
        """cuBLASLt's epilogue for this layer as the rewrites left it, or None with why the
        fused kernel runs it."""
        if self.pair_scale is not None:
            return None, "a residual sum with an FP8 copy: two outputs"
        if self.out_pad is not None:
            return None, "an output written inside the next conv's padding"
        if self.row_scales or self.k_pad:
            return None, "per-row input scales or a padded K"
        residual = self.res_act is not None
        act = Activation(self.res_act) if residual and self.res_act else Activation.NONE
        if act != Activation.NONE:
            return None, f"an activation ({act}) after the residual sum"
        return epilogue_for(True, Activation(self.act), residual, self.out_scale is not None)

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
        if epilogue is None or x2d.device.type != "cuda" or self.promote not in (0, 128):
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

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.lt_answer}"


def lt_note(model: torch.nn.Module) -> str | None:
    """ "cuBLASLt ran N layers' epilogues (GELU in its tanh form on k: names); the fused kernel
    ran m: name (why), ...", or None for a model without cuBLASLt layers."""
    plans = {n: m.lt_plan() for n, m in model.named_modules() if isinstance(m, LtFP8Matmul)}
    if not plans:
        return None
    ran = [n for n, (epilogue, _) in plans.items() if epilogue is not None]
    tanh = [n for n in ran if model.get_submodule(n).act == Activation.GELU]
    fell = [f"{n} ({why})" for n, (epilogue, why) in plans.items() if epilogue is None]
    note = f"{LT_NOTE_HEAD} {len(ran)} layers' epilogues"
    if tanh:
        note += f" (GELU in its {GELU_FORM} form on {len(tanh)}: {', '.join(tanh)})"
    if fell:
        note += f", the fused kernel {len(fell)}: {', '.join(fell)}"
    return note
