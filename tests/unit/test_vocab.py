"""Each closed vocabulary's values are spelled once, in `record/vocab.py`.

The check parses every module of `src/quantstudy` and collects its string constants, less
docstrings and the literal text of f-strings (prose may name an engine), and fails on any that
is a value of a checked vocabulary, outside `record/vocab.py` and the allow-list below.

Checked: the vocabularies whose values are not ordinary words, so a hit is almost surely the
vocabulary: Engine (and Baseline, whose values are engine names), KernelGroup,
Calibrator and Activation. Activation's "none" is left out: "none" is also what the report prints
for an empty list, and Tuning and Migration spell their off state with it. Not checked:
Device ("cpu", "cuda" are torch's device strings too), GateKind ("speed", "quality" are section
names), CompileMode ("default"), and the rest, which share values with ordinary option names.
"""

from __future__ import annotations

import ast
from pathlib import Path

from quantstudy.record.vocab import (
    Activation,
    Baseline,
    Calibrator,
    Engine,
    KernelGroup,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "quantstudy"
VOCAB_FILE = "record/vocab.py"
CHECKED = {
    m.value: e.__name__
    for e in (Baseline, Engine, KernelGroup, Calibrator, Activation)
    for m in e
    if m is not Activation.NONE
}

# (file under src/quantstudy, value): the same spelling with another meaning
ALLOWED = {
    ("package/shipped_check.py", "fp16"): "the package's own script: it must not import quantstudy",
    ("package/shipped_check.py", "fp8"): "the package's own script: it must not import quantstudy",
    ("bridge/commands.py", "fp16"): "the ONNX export's --precision choice, not an engine",
    ("bridge/commands.py", "fp32"): "the ONNX export's --precision choice, not an engine",
    ("bridge/commands.py", "fp8"): "a TensorRT layer's precision as trtexec reports it",
    ("bridge/export.py", "fp16"): "the ONNX graph's float precision",
    ("bridge/export.py", "fp32"): "the ONNX graph's float precision",
    ("bridge/qdq.py", "fp16"): "the ONNX graph's float precision",
    ("bridge/qdq.py", "fp32"): "the ONNX graph's float precision",
    ("bridge/runtime.py", "fp32"): "the ONNX graph's float precision",
    ("bridge/trtexec.py", "fp16"): "the ONNX graph's float precision (trtexec flags)",
    ("bridge/trt_json.py", "fp8"): "a TensorRT layer's precision, parsed from trtexec's JSON",
    ("bridge/trt_json.py", "fp16"): "a TensorRT layer's precision, parsed from trtexec's JSON",
    ("bridge/trt_json.py", "fp32"): "a TensorRT layer's precision, parsed from trtexec's JSON",
    ("bridge/trt_import.py", "fp8"): "a TensorRT layer's precision, parsed from trtexec's JSON",
    ("report/lookups.py", "fp16"): "the fp16 engine's display label",
    ("decision/schema.py", "max"): "a version-1 policy's KL threshold key",
    ("recipe/schema.py", "percentile"): "the percentile calibrator's parameter name",
    ("bench/options/variants.py", "percentile"): "the percentile calibrator's parameter name",
    ("bench/cli.py", "gelu"): "the `bench gelu` subcommand's name",
    ("quant/layers/spec.py", "gelu"): "the recipe's GELU policy field (GeluPolicy), set by name",
    ("record/quant_options.py", "gelu"): "the recipe's GELU policy field (GeluPolicy), set by name",
}


def _skipped(tree: ast.AST) -> set[int]:
    """ids of the docstring constants and f-strings' literal parts of `tree`."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            out |= {id(v) for v in node.values if isinstance(v, ast.Constant)}
    return out


def vocabulary_literals(source: str) -> list[tuple[int, str]]:
    """(line, value) of every string constant in `source` that is a checked vocabulary value."""
    tree = ast.parse(source)
    skipped = _skipped(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in CHECKED
        and id(node) not in skipped
    )


def test_checker_flags_a_literal_and_not_prose() -> None:
    assert vocabulary_literals('def f(x):\n    return x == "fp16"\n') == [(2, "fp16")]
    assert vocabulary_literals("x = {'fakequant': 1}") == [(1, "fakequant")]
    prose = '"""Times the fp16 engine."""\ndef f(x):\n    """fp16 or fp8."""\n    return x\n'
    assert vocabulary_literals(prose) == []
    assert vocabulary_literals('f"{n} fp16 ms"') == []
    assert vocabulary_literals("f\"{d['fp8']}\"") == [(1, "fp8")]


def test_vocabulary_values_are_spelled_only_in_vocab() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == VOCAB_FILE:
            continue
        for line, value in vocabulary_literals(path.read_text(encoding="utf-8")):
            if (rel, value) not in ALLOWED:
                found.append(f"{rel}:{line}: {value!r} is {CHECKED[value]}.{value.upper()}")
    assert not found, "vocabulary values spelled outside record/vocab.py:\n" + "\n".join(found)


def test_allow_list_is_used() -> None:
    """Every allowed pair still occurs: a stale entry would hide a new literal."""
    used = set()
    for rel, value in ALLOWED:
        source = (SRC / rel).read_text(encoding="utf-8")
        if any(v == value for _, v in vocabulary_literals(source)):
            used.add((rel, value))
    assert set(ALLOWED) - used == set()
