"""Every loop bound of a Triton kernel is one that both the compiled and the interpreted kernel
take.

Triton 3.6's interpreter (torch 2.11's Triton, the GPU image's) holds every runtime scalar as a
1-element numpy array, and `range` calls `int()` on its bounds, which numpy 2.5 refuses for a
1-d array ("only 0-dimensional arrays can be converted to Python scalars"). Compiled kernels and
Triton 3.8's interpreter take the same bound, so a kernel can pass the default CI and fail only
on the image. `quant/kernels/epilogue.loop_bound` turns such a bound into what the interpreter takes
and is the identity when compiled. This test reads the kernels' source (no Triton needed): every
argument of a `range` or `tl.range` in a `@triton.jit` function is a literal, a `tl.constexpr`
parameter, or a `loop_bound(...)`. `tl.static_range` unrolls at compile time and takes constexprs
only, so it is not checked.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "quantstudy"
pytestmark = pytest.mark.committed("src/quantstudy")


def _jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    def is_jit(decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "jit"

    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(map(is_jit, node.decorator_list))
    ]


def _constexpr_parameters(function: ast.FunctionDef) -> set[str]:
    return {
        arg.arg
        for arg in function.args.args
        if arg.annotation is not None and ast.unparse(arg.annotation).endswith("constexpr")
    }


def _is_range(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id == "range") or (
        isinstance(func, ast.Attribute) and func.attr == "range"
    )


def _taken_by_both(bound: ast.expr, constexprs: set[str]) -> bool:
    if isinstance(bound, ast.Constant):
        return True
    if isinstance(bound, ast.Name):
        return bound.id in constexprs
    func = bound.func if isinstance(bound, ast.Call) else None
    return isinstance(func, ast.Name) and func.id == "loop_bound"


def bad_bounds(source: str) -> list[str]:
    """`function: range(...)` for each loop of a jit function with a bound the interpreter of
    Triton 3.6 cannot take."""
    found = []
    for function in _jit_functions(ast.parse(source)):
        constexprs = _constexpr_parameters(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and _is_range(node):
                if not all(_taken_by_both(arg, constexprs) for arg in node.args):
                    found.append(f"{function.name}: {ast.unparse(node)}")
    return found


def test_every_kernel_loop_bound_is_taken_by_the_interpreter():
    kernels = [p for p in sorted(SRC.rglob("*.py")) if "triton.jit" in p.read_text()]
    assert any(p.name == "border.py" for p in kernels), "the kernels were not found"
    found = {str(p.relative_to(SRC)): bad_bounds(p.read_text()) for p in kernels}
    assert {path: bad for path, bad in found.items() if bad} == {}


def test_the_check_finds_a_runtime_bound():
    """The shape the border kernel had: a bound computed in the kernel, and one argument."""
    source = (
        "@triton.jit\n"
        "def k(ptr, n, BLOCK: tl.constexpr):\n"
        "    head = tl.where(n > 0, n, 0)\n"
        "    for s in range(0, head, BLOCK):\n"
        "        pass\n"
        "    for s in tl.range(0, n, BLOCK):\n"
        "        pass\n"
        "    for s in range(0, loop_bound(head), BLOCK):\n"
        "        pass\n"
        "    for s in tl.static_range(BLOCK):\n"
        "        pass\n"
    )
    assert bad_bounds(source) == ["k: range(0, head, BLOCK)", "k: tl.range(0, n, BLOCK)"]
