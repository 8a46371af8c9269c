"""The engine exported with `torch.export` and its FP8 ops pointed at their packaged ops.

`torch.export` keeps every custom op as one opaque node, the study's (`quantstudy::fp8_gemm`,
...) as well. Each such node is retargeted to its packaged op (`package/ops.py`: the same
function and schema, so the node's arguments and recorded shapes stay valid); AOTInductor then
traces into the packaged ops and compiles their kernels. A `quantstudy` op left in the graph
would make the package call back into quantstudy at run time, so any other one is refused.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from quantstudy.package.ops import NAMESPACE, PACKAGED
from quantstudy.quant.layers.opdef import STUDY_NAMESPACE


def export_engine(
    module: nn.Module, example: torch.Tensor, dynamic: tuple[int, int] | None
) -> ExportedProgram:
    """`module` exported for `example`'s shape, or with the batch dimension free within
    `dynamic` (min, max)."""
    shapes = None
    if dynamic is not None:
        shapes = ({0: Dim("batch", min=dynamic[0], max=dynamic[1])},)
    with torch.no_grad():
        return torch.export.export(module, (example,), dynamic_shapes=shapes)


def retarget(program: ExportedProgram) -> dict[str, int]:
    """Point every study FP8 op of `program` at its packaged op, in place; returns nodes per
    op."""
    counts: dict[str, int] = {}
    graph = program.graph_module.graph
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        namespace, _, name = node.target.name().partition("::")
        if namespace != STUDY_NAMESPACE:
            continue
        packaged = PACKAGED.get(name)
        if packaged is None:
            raise RuntimeError(
                f"the engine calls {namespace}::{name}, which has no packaged op: declare it "
                "with quant.layers.opdef.fp8_op and list it in quantstudy.package.ops.STUDY_OPS"
            )
        node.target = getattr(getattr(torch.ops, NAMESPACE), name).default
        counts[name] = counts.get(name, 0) + 1
    program.graph_module.recompile()
    return counts
