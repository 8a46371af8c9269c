"""`quantstudy bench gelu` on the CPU: the code tally of one layer against a direct count, and
the record's rows (a run replaces its model's row, keeps the others, refuses another file)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantstudy.bench import gelu_forms
from quantstudy.bench.cli import Context
from quantstudy.quant.formats.fp8 import to_fp8
from quantstudy.record.errors import UserError


def test_the_tally_counts_the_codes_the_two_forms_write_differently() -> None:
    y = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0)) * 3
    scale = torch.tensor(0.01)
    codes = gelu_forms._Codes(scale)
    act = nn.GELU()
    act.register_forward_hook(codes.hook)
    act(y)
    act(y[:10])
    erf, tanh = to_fp8(F.gelu(y), scale), to_fp8(F.gelu(y, approximate="tanh"), scale)
    apart = erf.view(torch.uint8) != tanh.view(torch.uint8)
    first = erf[:10].view(torch.uint8) != tanh[:10].view(torch.uint8)
    assert codes.values == y.numel() + y[:10].numel()
    assert codes.differ == int(apart.sum() + first.sum()) > 0
    # steps as ranks among E4M3's finite values (both zeros one value), counted apart
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ladder = values[values.isfinite()].unique()
    steps = (_rank(erf, ladder) - _rank(tanh, ladder)).abs()
    assert codes.max_steps == int(steps.max()) >= 1
    same = gelu_forms._Codes(scale)
    act = nn.GELU()
    act.register_forward_hook(same.hook)
    act(torch.zeros(8, 8))
    assert (same.values, same.differ, same.max_steps) == (64, 0, 0)


def _rank(codes: torch.Tensor, ladder: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(ladder, codes.float().contiguous())


def _row(model: str, differ: int) -> dict[str, Any]:
    score = {"agreement": 1.0, "differ": differ, "n": 4}
    return {
        "model": model, "weights": "random", "n_heldout": 4, "tanh_layers": ["fc1"],
        "gelu_layers": 1, "codes": {"share": 0.001, "differ": 1, "values": 1000, "max_steps": 1},
        "erf": score, "tanh": score, "tanh_vs_erf": score, "floor": score, "half_floor": score,
    }  # fmt: skip


def test_a_run_replaces_its_model_s_row_and_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gelu.json"
    measured = iter([_row("a", 0), _row("b", 1), _row("a", 2)])
    monkeypatch.setattr(gelu_forms, "measure", lambda *_: next(measured))
    args = argparse.Namespace(record=out, threads=0)
    context = Context(lambda: None, [])  # type: ignore[arg-type, return-value]
    for _ in range(3):
        gelu_forms.run(args, context)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["floor"]["differ"]) for r in rows] == [("b", 1), ("a", 2)]
    assert "| a (random) | 4 | 1 of 1 | 0.1000% (1 of 1000) | 1 |" in capsys.readouterr().out
    other = tmp_path / "other.json"
    other.write_text('{"kind": "options", "rows": []}')
    with pytest.raises(UserError, match="not a GELU forms record"):
        gelu_forms.run(argparse.Namespace(record=other, threads=0), context)
    assert other.read_text() == '{"kind": "options", "rows": []}'  # refused, left as it was
    other.write_text("not json")  # a damaged record: refused before anything is measured
    with pytest.raises(UserError, match="is not valid JSON"):
        gelu_forms.run(argparse.Namespace(record=other, threads=0), context)
    assert other.read_text() == "not json"
