"""What a backend runs, as data (`Support`, `Alignment`), and which `ProductOp` a float layer is
and why a backend cannot run it (`op_blocker`, every backend's default `Backend.blocker`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantstudy.record.vocab import Activation, Epilogue, ProductOp

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Alignment:
    """The layout a backend's product needs: K (input channels) and N (output channels) in
    multiples of `k` and `n`; `pads`: the backend zero-pads a layer that misses them (exact:
    zero columns add exact zeros), else it refuses the layer (`Backend.blocker`)."""

    k: int = 1
    n: int = 1
    pads: bool = True

    def missed(self, k: int, n: int) -> str | None:
        """Why a (K, N) product does not fit, where the backend does not pad; None: it fits."""
        if self.pads or (k % self.k == 0 and n % self.n == 0):
            return None
        return f"K {k} and N {n} must be multiples of {self.k} and {self.n}"


@dataclass(frozen=True)
class Support:
    """What a backend runs: the layer kinds (`ops`), what its own kernel does beside the product
    (`epilogues`; with `Epilogue.ACTIVATION`, which `activations`), the dtypes it writes
    (`out_dtypes`, torch's names: "float16", "bfloat16", "float32", "float8_e4m3fn") and the
    layout it needs (`alignment`)."""

    ops: frozenset[ProductOp]
    epilogues: frozenset[Epilogue]
    out_dtypes: frozenset[str]
    activations: frozenset[Activation] = frozenset()
    alignment: Alignment = Alignment()

    def takes(self, epilogue: Epilogue, act: Activation = Activation.NONE) -> bool:
        """Whether the backend's own kernel computes `epilogue` (and, for an activation, `act`)."""
        if epilogue == Epilogue.ACTIVATION and act == Activation.NONE:
            return True
        if epilogue not in self.epilogues:
            return False
        return epilogue != Epilogue.ACTIVATION or act in self.activations


def op_of(layer: nn.Module) -> tuple[ProductOp | None, str]:
    """The op a float `layer` runs as an FP8 product, or None with why it runs none: a plain
    linear or dense 1x1 conv (`real_fp8_blocker`), a depthwise conv or a dense kxk conv
    (`fused_depthwise.depthwise_fp8_blocker`, `fused_conv.kxk_fp8_blocker`)."""
    from torch import nn

    from quantstudy.quant.layers.fused_conv import kxk_fp8_blocker
    from quantstudy.quant.layers.fused_depthwise import depthwise_fp8_blocker
    from quantstudy.quant.layers.matmul import real_fp8_blocker

    plain = real_fp8_blocker(layer)
    if plain is None:
        return (ProductOp.LINEAR if isinstance(layer, nn.Linear) else ProductOp.CONV1X1), ""
    if isinstance(layer, nn.Conv2d):
        if depthwise_fp8_blocker(layer) is None:
            return ProductOp.DEPTHWISE, ""
        if kxk_fp8_blocker(layer) is None:
            return ProductOp.CONV_KXK, ""
    return None, plain


def op_blocker(layer: nn.Module, support: Support) -> str | None:
    """Why a backend of `support` cannot run `layer`; None when it can. A layer of an op the
    backend lacks is refused with why it is no plain product (what `real_fp8_blocker` says)."""
    from quantstudy.quant.layers.matmul import real_fp8_blocker

    op, why = op_of(layer)
    if op is None:
        return why
    if op not in support.ops:
        return real_fp8_blocker(layer) or f"{op} has no kernel in this backend"
    n = int(layer.weight.shape[0])
    k = int(layer.weight[0].numel())
    return support.alignment.missed(k, n)
