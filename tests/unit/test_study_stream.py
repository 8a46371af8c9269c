"""The streamed held-out pass gives the quality figures of the whole-set pass, bit for bit,
whether it runs in one go or is interrupted and resumed from its cached chunks."""

from pathlib import Path

import pytest
import torch
from torch import nn

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.data.stream import Uint8Transform
from quantstudy.engines.builders import BuiltEngine
from quantstudy.engines.run import half_storage, reordered, run_engine
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quality.gap import emulation_gap, emulation_gap_rows, gap_pairs
from quantstudy.quality.image_scores import RowSet
from quantstudy.quality.metrics import score_engine, score_rows
from quantstudy.quality.nonfinite import scan_nonfinite, scan_rows
from quantstudy.record import Preprocessing
from quantstudy.study import heldout
from quantstudy.study.cache import StageCache
from quantstudy.study.heldout import EnginePass, run_heldout

torch.set_num_threads(1)
CPU = torch.device("cpu")
_PRE = Preprocessing(
    input_size=(3, 32, 32),
    crop_pct=0.875,
    crop_mode="center",
    interpolation="bicubic",
    mean=(0.5, 0.5, 0.5),
    std=(0.5, 0.5, 0.5),
    settings="train",
    source="test",
)


def _engine(name: str, module: nn.Module) -> BuiltEngine:
    return BuiltEngine(name, CPU, torch.float32, False, module, module, False, None)


def _net(seed: int) -> nn.Module:
    """A small classifier over 1000 classes; `seed` makes the engines differ."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Conv2d(8, 16, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 1000),
    ).eval()  # fmt: skip


def _engines() -> dict[str, BuiltEngine]:
    ref = _net(0)
    return {
        "fp32": _engine("fp32", ref),
        "fp16": _engine("fp16", _net(1)),
        "fp8": _engine("fp8", _net(2)),
        "fakequant": _engine("fakequant", _net(3)),
    }


def _passes(engines: dict[str, BuiltEngine]) -> list[EnginePass]:
    emu = engines["fakequant"]
    return [EnginePass(n, e) for n, e in engines.items()] + [
        EnginePass("fakequant_reordered", emu, lambda: reordered(emu)),
        EnginePass("fakequant_half", emu, lambda: half_storage(emu, torch.bfloat16)),
    ]


def _pairs(names) -> list:
    return (
        [("fp32", n) for n in ("fp16", "fp8", "fakequant")] + [("fp16", "fp8")] + gap_pairs(names)
    )


def _stream(items, cache, batch: int = 2) -> heldout.HeldoutResult:
    passes = _passes(_engines())
    transform = Uint8Transform(EvalTransform(_PRE).steps)
    pairs = _pairs([p.name for p in passes])
    return run_heldout(
        passes, pairs, items, transform, eval_batch=batch, device=CPU, cache=cache, workers=0
    )


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(heldout, "CHUNK_IMAGES", 4)  # 12 images: 3 chunks of 2 batches of 2


def test_streamed_rows_score_as_the_whole_set(tiny_imagenet, small_chunks):
    items = scan_folder(tiny_imagenet).items
    got = _stream(items, None, batch=2)
    x, labels = load_images(items, EvalTransform(_PRE))
    engines = _engines()
    logits = {n: run_engine(e, x, 2) for n, e in engines.items()}
    with reordered(engines["fakequant"]):
        logits["fakequant_reordered"] = run_engine(engines["fakequant"], x, 2)
    with half_storage(engines["fakequant"], torch.bfloat16):
        logits["fakequant_half"] = run_engine(engines["fakequant"], x, 2)
    rows, y = got.rows, got.labels
    for name in ("fp16", "fp8", "fakequant"):
        want = score_engine(name, logits["fp32"], logits[name], labels, seed=3)
        assert score_rows(name, rows, "fp32", y, seed=3) == want
    assert score_rows("fp8", rows, "fp16", y) == score_engine(
        "fp8", logits["fp16"], logits["fp8"], labels
    )
    h = logits
    want_gap = emulation_gap(
        h["fp8"], h["fakequant"], h["fakequant_reordered"], h["fp32"], None,
        (h["fakequant_half"], torch.bfloat16),
    )  # fmt: skip
    assert emulation_gap_rows(rows, torch.bfloat16) == want_gap
    ids = [i.id for i in items]
    stress = torch.zeros(1, 1000)
    assert scan_rows("fp8", rows.engines["fp8"].valid, ids, stress, ["blank"]) == scan_nonfinite(
        "fp8", h["fp8"], ids, stress, ["blank"]
    )


class _Stop(Exception):
    pass


def test_an_interrupted_pass_resumes_from_its_chunks_with_the_same_rows(
    tiny_imagenet, tmp_path: Path, small_chunks, monkeypatch
):
    items = scan_folder(tiny_imagenet).items
    whole = _stream(items, None).rows
    cache = StageCache.keyed(tmp_path, ["a study"])
    calls = {"n": 0}
    real = heldout.RowSet.of

    def stop_at_second_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise _Stop  # the second chunk is in flight
        return real(*args, **kwargs)

    monkeypatch.setattr(heldout.RowSet, "of", stop_at_second_chunk)
    with pytest.raises(_Stop):
        _stream(items, cache)
    monkeypatch.setattr(heldout.RowSet, "of", real)
    assert len(list(tmp_path.glob("rows-*.pt"))) == 1  # the first chunk's rows were kept
    resumed = _stream(items, cache)
    assert resumed.resumed_images == 4
    _same_rows(resumed.rows, whole)


def _same_rows(a: RowSet, b: RowSet) -> None:
    ta, tb = a.to_tensors(), b.to_tensors()
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.equal(ta[key], tb[key]) or (
            ta[key].is_floating_point()
            and torch.allclose(ta[key], tb[key], equal_nan=True, rtol=0, atol=0)
        ), key
