"""One declaration per FP8 operator: the study's op and the packaged op from one function.

The fused FP8 layers reach their Triton kernels through torch operators, and need them in two
forms. The study's engine needs an op that Inductor leaves opaque (`torch.library.custom_op`):
its launchers autotune, keep a tuning cache and build tensor descriptors on the host, which
Inductor could not trace. A package needs the opposite: AOTInductor must trace into the op and
compile the Triton launches it finds (`torch.library.triton_op`), or the package would call back
into quantstudy at run time.

`fp8_op` declares both from one typed function. Its signature is the schema (inferred once and
given to both registrations, so the two cannot drift apart: `package/graph.py` swaps one for
the other in an exported graph, node arguments unchanged). Its body runs the torch arithmetic
off CUDA (what CPU engines and CPU packages compute) and the launchers on CUDA. A fake function
gives the study's op its outputs' shapes for tracing; the packaged op's fake is its body, as for
every `triton_op`. The study's op is registered at once under `quantstudy::`; `FP8Op.packaged`
registers the same function as a `triton_op` where a package is built (`package/ops.py`).

The two differ only in how the launchers run, which the body does not decide: within
`quant.kernels.launches.replaying(record)` (a package being compiled) each launch takes the tile
the study's run recorded for it and goes through torch's `wrap_triton`; otherwise it autotunes
and launches directly (`quant/kernels/launches.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

STUDY_NAMESPACE = "quantstudy"

# A fake function's argument: the op's arguments by name, defaults applied.
OpArgs = SimpleNamespace


class FP8Op:
    """An FP8 operator declared once (module docstring). Called, it is the study's op."""

    def __init__(self, name: str, body: Callable[..., Any], fake: Callable[[OpArgs], Any]) -> None:
        self.name = name
        self.body = body
        self.schema: str = torch.library.infer_schema(body, mutates_args=())
        self.study = torch.library.custom_op(
            f"{STUDY_NAMESPACE}::{name}", body, mutates_args=(), schema=self.schema
        )
        signature = inspect.signature(body)

        def shapes(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return fake(OpArgs(**bound.arguments))

        self.study.register_fake(shapes)
        self.__doc__ = body.__doc__
        self._packaged: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.study(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FP8Op({STUDY_NAMESPACE}::{self.name}{self.schema})"

    def packaged(self, namespace: str) -> Any:
        """The same function registered as a `torch.library.triton_op` `namespace::name`, with
        the study op's schema (torch 2.11 infers it again from the function: the same text)."""
        if namespace not in self._packaged:
            from torch.library import triton_op

            op = triton_op(
                f"{namespace}::{self.name}", self.body, mutates_args=(), schema=self.schema
            )
            self._packaged[namespace] = op
        return self._packaged[namespace]


def fp8_op(name: str, fake: Callable[[OpArgs], Any]) -> Callable[[Callable[..., Any]], FP8Op]:
    """Declare the decorated function as the FP8 operator `name` (module docstring); `fake`
    returns empty outputs of the right shapes, dtypes and strides from the op's arguments."""

    def declare(body: Callable[..., Any]) -> FP8Op:
        return FP8Op(name, body, fake)

    return declare
