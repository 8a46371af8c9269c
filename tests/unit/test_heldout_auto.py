"""`--heldout auto[:MAX]`: the option's values, the round loop's stop rule and its record."""

import numpy as np
import pytest
import torch
from test_study_stream import _PRE, _engines, _pairs, _passes

from quantstudy.cli import main
from quantstudy.data.folders import scan_folder
from quantstudy.data.split import stream_order
from quantstudy.data.stream import Uint8Transform
from quantstudy.decision.policy import load_policy
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quality.image_scores import PairRows, Predictions, RowSet
from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import GateStatus, StopReason
from quantstudy.study import heldout
from quantstudy.study.cache import StageCache
from quantstudy.study.rounds import Rounds, per_image

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("given", "value", "bound"),
    [(300, 300, 300), ("300", 300, 300), ("auto", "auto", None), ("AUTO:5000", "auto:5000", 5000)],
)
def test_heldout_takes_a_count_or_auto_with_an_optional_bound(given, value, bound):
    config = StudyConfig(model="m", data="d", heldout=given)
    assert config.heldout == value and config.heldout_bound == bound
    assert config.sequential == isinstance(value, str)


@pytest.mark.parametrize("bad", ["0", "-2", "auto:0", "auto:", "autox", "auto:1.5", "1.5", "many"])
def test_a_bad_heldout_is_one_clear_line(bad, capsys, tmp_path):
    with pytest.raises(UserError, match="--heldout: must be a positive image count, 'auto'"):
        StudyConfig(model="m", data="d", heldout=bad)
    argv = ["run", "mobilenetv4_conv_small", "--data", str(tmp_path), "--heldout", bad]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quantstudy: error: --heldout: must be"), err
    assert not (tmp_path / "studies").exists()


@pytest.mark.parametrize("big", ["100000001", "auto:100000001", "10000000000"])
def test_a_heldout_count_past_any_folder_is_refused(big):
    """Not a count of images (the bound is `MAX_IMAGES`), fixed or as an auto study's bound."""
    with pytest.raises(UserError, match=r"--heldout: must be at most 100000000 images;"):
        StudyConfig(model="m", data="d", heldout=big)
    assert StudyConfig(model="m", data="d", heldout="auto:100000000").heldout_bound == 100_000_000


def test_the_stream_order_is_a_seeded_shuffle_of_every_image(tiny_imagenet):
    items = scan_folder(tiny_imagenet).items
    a, b = stream_order(items, 0), stream_order(list(reversed(items)), 0)
    assert a == b and sorted(i.id for i in a) == sorted(i.id for i in items)
    assert [i.id for i in a] != sorted(i.id for i in a)  # not class (id) order
    assert stream_order(items, 1) != a


def _rows(n: int, differ_every: int | None = None, nan_at: int | None = None) -> RowSet:
    """fp32, fp16 and fp8 rows over `n` images; fp8 differs from both on every
    `differ_every`-th image and has a non-finite row at `nan_at`."""
    top1 = np.arange(n) % 7
    fp8 = top1.copy()
    if differ_every:
        fp8[::differ_every] += 1
    valid = np.ones(n, dtype=bool)
    fp8_valid = valid.copy()
    if nan_at is not None:
        fp8_valid[nan_at] = False
    kl = np.full(n, 1e-4)
    pair = PairRows(finite=fp8_valid, kl=np.where(fp8_valid, kl, np.nan), maxdiff=kl)
    return RowSet(
        engines={
            "fp32": Predictions(top1, valid, valid),
            "fp16": Predictions(top1, valid, valid),
            "fp8": Predictions(fp8, fp8_valid, valid),
        },
        pairs={("fp32", "fp8"): pair, ("fp16", "fp8"): pair},
    )


def _take_rounds(rows: RowSet, labels: np.ndarray, rounds: Rounds, size: int) -> int:
    """Feed `rounds` prefixes of `rows` as the held-out pass does; images when it stopped."""
    for end in range(size, rows.n_images + size, size):
        end = min(end, rows.n_images)
        prefix = RowSet.concat([_slice(rows, end)])
        if rounds(prefix, labels[:end]):
            return end
    return rows.n_images


def _slice(rows: RowSet, end: int) -> RowSet:
    engines = {
        k: Predictions(p.top1[:end], p.valid[:end], p.top5[:end]) for k, p in rows.engines.items()
    }
    pairs = {
        k: PairRows(p.finite[:end], p.kl[:end], p.maxdiff[:end]) for k, p in rows.pairs.items()
    }
    return RowSet(engines=engines, pairs=pairs)


def test_identical_engines_settle_and_stop_before_the_data_runs_out():
    policy, _ = load_policy(None)
    rows = _rows(20_000)
    labels = np.arange(20_000) % 7
    rounds = Rounds(policy)
    stopped = _take_rounds(rows, labels, rounds, 256)
    assert stopped < 20_000 and rounds.looks[-1].settled
    assert [look.images for look in rounds.looks] == list(range(256, stopped + 1, 256))
    section = rounds.section(256, None, 20_000)
    assert section.stop_reason == StopReason.SETTLED and len(section.looks) == len(rounds.looks)
    assert all(g.status == GateStatus.PASS for g in section.looks[-1].gates)


def test_a_nan_fails_its_gate_at_once_and_open_gates_run_to_the_bound():
    policy, _ = load_policy(None)
    rows = _rows(600, differ_every=40, nan_at=300)
    rounds = Rounds(policy)
    assert _take_rounds(rows, np.arange(600) % 7, rounds, 256) == 600  # never all settled
    gates = {g.name: g for g in rounds.looks[-1].gates}
    assert gates["no NaN/Inf"].status == GateStatus.FAIL
    assert gates["no NaN/Inf"].settled_at == 301  # the image that failed it
    assert gates["top-1 agreement"].status == GateStatus.INCONCLUSIVE
    assert rounds.section(256, 600, 600).stop_reason == StopReason.UPPER_BOUND
    assert rounds.section(256, None, 600).stop_reason == StopReason.DATA_EXHAUSTED


def test_per_image_never_counts_a_nonfinite_row_as_agreeing():
    rows = _rows(4, nan_at=1)
    rows.engines["fp16"] = Predictions(rows.engines["fp16"].top1, np.array([1, 0, 1, 1], bool))
    per = per_image(rows, None)
    assert per.top1["fp8"][1] != per.top1["fp16"][1]  # both non-finite: still not agreeing
    assert per.nonfinite["fp8"].tolist() == [False, True, False, False]


def test_the_stream_stops_where_the_rule_says_and_resumes_the_same_looks(tiny_imagenet, tmp_path):
    items = scan_folder(tiny_imagenet).items
    passes = _passes(_engines())
    transform = Uint8Transform(EvalTransform(_PRE).steps)
    cache = StageCache.keyed(tmp_path, ["auto"])
    seen: list[int] = []

    def stop_after_8(rows, labels):
        seen.append(rows.n_images)
        assert labels is not None and len(labels) == rows.n_images
        return rows.n_images >= 8

    def run():
        return heldout.run_heldout(
            passes, _pairs([p.name for p in passes]), items, transform, eval_batch=2,
            device=torch.device("cpu"), cache=cache, workers=0, chunk_images=4,
            stop=stop_after_8,
        )  # fmt: skip

    first = run()
    assert first.stopped and first.n_images == 8 and seen == [4, 8]
    seen.clear()
    again = run()  # every round it needs is cached: the same looks, no image decoded
    assert again.stopped and again.n_images == 8 and seen == [4, 8]
    assert again.resumed_images == 8
