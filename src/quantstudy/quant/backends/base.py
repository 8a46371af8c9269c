"""What an FP8 product backend declares and does (`Backend`), one module per backend.

A backend is one way to run a real FP8 layer's product: the fused Triton kernels (`fused.py`),
torch._scaled_mm (`scaled_mm.py`), or another (cuBLASLt with its epilogues). Everything outside
this folder that needs to know about backends asks the registry (`registry.py`): the command
line's `--fp8-kernel` choices, the per-layer kernel choice (`engines/kernel_choice.py`), the
record's per-backend timings (`LayerKernel.us`), `bench products`' columns and `bench peers`'
engines. So a backend declares, as data, what it supports (`Support`: ops, epilogues,
activations, output dtypes, alignment), and implements four things: whether it runs on this
machine (`availability`, never an ImportError), why a layer cannot run on it (`blocker`), the
module it puts in a layer's place (`build_layer`, whose forward launches the product), and one
product on plain tensors (`launch`, what `bench products` times). A backend whose layer can
take a fused layer's whole state, epilogue and hand-offs included, says so (`takes_fused`) and
makes it (`from_fused`): the per-layer kernel choice then times and installs it with the
layer's own epilogue, not followed by that epilogue as separate ops.

Nothing here imports torch at import time: the command line lists the backends' names while it
builds its parser, before torch loads (tests/unit/test_cli.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from quantstudy.quant.backends.ops import Alignment, Support, op_blocker
from quantstudy.record.vocab import Activation

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantstudy.quant.layers.spec import FP8LayerSpec
    from quantstudy.record.build_spec import BuildSpec
    from quantstudy.record.vocab import GeluPolicy

__all__ = ["Alignment", "Availability", "Backend", "Product", "Support"]

Availability = tuple[bool, str]
"""Whether a backend runs on this machine, and in one line why not ("" where it does)."""


@dataclass(frozen=True)
class Product:
    """One FP8 product on plain tensors, as `Backend.launch` runs it: `xq` (M, K) and `w8`
    (N, K) FP8 E4M3, `x_scale` a float32 scalar tensor, `w_scale` a scalar or (N,) float32,
    `bias` (N,) float32 or None; `act` after the bias; `out_dtype`, and with `out_scale` the
    output written as FP8 with that scale (`out_dtype` E4M3); `round_to`: where the epilogue
    rounds, as the unfused engine stores (None: float32); `promote`: products summed in the
    tensor cores before float32 takes over (0: all of K)."""

    xq: torch.Tensor
    w8: torch.Tensor
    x_scale: torch.Tensor
    w_scale: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    act: Activation = Activation.NONE
    out_scale: torch.Tensor | None = None
    round_to: torch.dtype | None = None
    promote: int = 0


class Backend(ABC):
    """An FP8 product backend (module docstring). Subclasses set the class attributes and
    implement the abstract methods; a module of this folder exposes its instance as `BACKEND`,
    which the registry finds (`registry.py`)."""

    name: ClassVar[str]  # how `--fp8-kernel`, the record and the kernel choice name it
    summary: ClassVar[str]  # what a layer of it runs, in one line (the report's method section)
    support: ClassVar[Support]
    # the column `bench products` times this backend's `launch` under (plain, then with each
    # engine epilogue it supports); None: that bench times it by columns of its own
    bench_label: ClassVar[str | None] = None
    # whether this backend's layer is made from a fused FP8 layer's whole state (`from_fused`);
    # False: from the float layer alone (`build_layer`), and the per-layer kernel choice runs
    # the fused layer's epilogue after it as separate ops (`engines/unfused.py`)
    takes_fused: ClassVar[bool] = False

    @abstractmethod
    def availability(self) -> Availability:
        """Whether this machine runs the backend, and why not, in one line. Never raises: a
        missing library or GPU is an answer, not an ImportError."""

    def blocker(self, layer: nn.Module) -> str | None:
        """Why `layer` (a float conv or linear) cannot run a real FP8 product here; None when it
        can. The default: its op is one of `support.ops` and its shape fits the alignment."""
        return op_blocker(layer, self.support)

    @abstractmethod
    def build_layer(self, layer: nn.Module, spec: FP8LayerSpec, build: BuildSpec) -> nn.Module:
        """The module that replaces the float `layer` (one `blocker` passes) in an engine of
        `build`, quantized as `spec` says (`spec.promote` is `build.promote`); its forward
        launches the product. Fields of `spec` the backend cannot honour are refused
        (`FP8LayerSpec.refuse`), never dropped."""

    def from_fused(self, fused: nn.Module, gelu: GeluPolicy) -> nn.Module | None:
        """For a backend that `takes_fused`: its layer in place of the fused FP8 layer `fused`,
        made from its whole state as the engine's rewrites left it (the absorbed activation,
        the FP8 hand-offs, the residual sum), so it computes the same epilogue with the same
        interface, under the recipe's `gelu`. None where this backend would not run its own
        kernel for that layer (it would fall back to another's), and for every other backend."""
        return None

    def runs_own_kernel(self, fused: nn.Module, gelu: GeluPolicy) -> bool:
        """Whether `from_fused` gives a layer for `fused` under `gelu`, asked without making it
        (the engine asks for every row of a kernel choice); a backend whose `from_fused` copies
        state answers from the state instead."""
        return self.from_fused(fused, gelu) is not None

    def bind(self, model: nn.Module, device: torch.device) -> None:  # noqa: B027 - optional
        """Let this backend's layers of `model`, now on `device`, take what the device supports
        (an output dtype, a workspace); nothing by default."""

    def output_note(self, model: nn.Module) -> str | None:
        """What this backend's layers of `model` write, in words, for the engine's layout
        (`FP8Layout.scaled_mm_output`); None: nothing to say."""
        return None

    @abstractmethod
    def launch(self, product: Product) -> torch.Tensor:
        """One product on plain tensors (`Product`), (M, N) in `product.out_dtype`: what
        `bench products` times. An epilogue outside `support` is a ValueError."""
