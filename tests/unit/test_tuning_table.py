"""The shipped tuning table (`quant/kernels/table.py`) on CPU, with a fake kernel and fake
store entries: a table hit launches without tuning; a table of another Triton, GPU or kernel
source, or a config today's prune drops, falls back to tuning into the store; where each launch
took its config is counted per stage; the table is built from a store, keeping only today's
kernel sources; the kernel source hash follows what a kernel computes, and only its own."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from _interpreter import require_triton

require_triton()

import triton  # noqa: E402

from quantstudy.bench.tuning_table import tabled_kernels  # noqa: E402
from quantstudy.cli import main  # noqa: E402
from quantstudy.quant.kernels import choices, search, table, tuning  # noqa: E402
from quantstudy.quant.kernels.kernel_source import kernel_source_sha  # noqa: E402
from quantstudy.record.timings import TileChoices  # noqa: E402
from quantstudy.study.stage_timer import StageTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_kernel_tuning import _fake, _launch  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def timed(monkeypatch) -> list[int]:
    """Timing faked: block 32 is fastest; returns the blocks timed (none: nothing tuned)."""
    blocks: list[int] = []

    def timer(fn):
        blocks.append(fn.keywords["BLOCK"])
        return 1.0 if fn.keywords["BLOCK"] == 32 else 2.0

    monkeypatch.setattr(search, "screen_time", timer)
    monkeypatch.setattr(search, "full_time", timer)
    return blocks


@pytest.fixture
def tables(tmp_path: Path, monkeypatch, timed) -> Path:
    """An empty store and an empty folder of tables for this test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("QUANTSTUDY_TRITON_COMPILE_THREADS", "1")
    monkeypatch.delenv("QUANTSTUDY_TUNE_LOG", raising=False)
    monkeypatch.setattr(table, "TABLES", tmp_path / "tables")
    for forget in (choices.forget, table.forget, tuning._CHOSEN.clear):
        forget()
    yield tmp_path / "tables"
    for forget in (choices.forget, table.forget, tuning._CHOSEN.clear):
        forget()


def _table(folder: Path, fake: tuning.Tuned, block: int, **change: str) -> None:
    """A table for this CPU holding the launch `_launch` makes (M 100, OPT 1) at `block`."""
    config = next(c for c in fake.configs if c.kwargs["BLOCK"] == block)
    entry = {
        "kernel": fake.name, "source": kernel_source_sha(fake.kernel),
        "launch": {"M": 100, "OPT": 1}, "dtypes": ["torch.float32"], "config": str(config),
        "words": "fake",
    }  # fmt: skip
    data = {"format": table.FORMAT, "gpu": "cpu", "triton": triton.__version__}
    data |= {k: v for k, v in change.items() if k in data}
    entry |= {k: v for k, v in change.items() if k in entry}
    folder.mkdir(parents=True, exist_ok=True)
    table.table_file("cpu", folder).write_text(json.dumps(data | {"entries": [entry]}))
    table.forget()


def test_a_table_hit_launches_its_config_without_tuning(tables: Path, timed):
    """The table says 64 where tuning would pick 32: 64 is launched, nothing timed or stored."""
    fake = _fake()
    _table(tables, fake, 64)
    logged = len(tuning.TUNE_LOG)
    assert _launch(fake) == 64 and timed == [] and len(tuning.TUNE_LOG) == logged
    assert fake.kernel.launched == [64]
    assert not choices.store_path().exists()
    assert tuning.CHOICE_LOG[-1] == {"kernel": "fake", "origin": "table"}


@pytest.mark.parametrize(
    "change",
    [
        {"triton": "0.0.1"},  # another Triton
        {"gpu": H100},  # a table of another GPU under this one's name
        {"source": "0" * 64},  # tuned for another kernel source
        {"dtypes": ["torch.float16"]},  # another launch
    ],
)
def test_a_table_of_another_triton_gpu_or_source_falls_back_to_tuning(tables, timed, change):
    fake = _fake()
    _table(tables, fake, 64, **change)
    assert _launch(fake) == 32 and sorted(timed) == [16, 32, 64]  # tuned as before
    assert tuning.CHOICE_LOG[-1]["origin"] == "tuned"
    [stored] = json.loads(choices.store_path().read_text())["choices"].values()
    assert stored["config"] == 1 and stored["source"] == kernel_source_sha(fake.kernel)


def test_a_table_config_the_prune_drops_is_not_launched(tables, timed):
    """Block 128 is over M 100: today's prune drops it, so the launch tunes."""
    fake = _fake()
    _table(tables, fake, 128)
    assert _launch(fake) == 32 and timed


def test_a_stage_counts_where_each_launch_took_its_config_once(tables, timed):
    """One launch from the table, one tuned, the tuned one again (no count), then, in a new
    process's store, the tuned one stored: table 1, store 1, tuned 1 over the stages."""
    fake = _fake()
    _table(tables, fake, 64)  # M 100
    timer = StageTimer(echo=None)
    with timer.stage("engine fp8: build"):
        _launch(fake)
        _launch(fake, m=20)  # not in the table: tuned
        _launch(fake, m=20)
    choices.forget()
    tuning._CHOSEN.clear()  # a new process: the store on disk, the table
    with timer.stage("engine fp8: compile 128"):
        assert _launch(fake, m=20) == 16
    with timer.stage("score"):
        pass
    first, second, third = timer.section().stages
    assert first.choices == TileChoices(table=1, store=0, tuned=1)
    assert first.tuning is not None and first.tuning.launches == 1
    assert second.choices == TileChoices(table=0, store=1, tuned=0) and third.choices is None


def _stored(kernel: str, source: str, block: int, **change: str) -> tuple[str, dict]:
    entry = {
        "config": 0, "kernel": kernel, "source": source, "launch": {"M": block},
        "dtypes": ["torch.float8_e4m3fn"], "chosen": f"BLOCK: {block}", "words": f"{block}",
        "gpu": H100, "triton": triton.__version__,
    } | change  # fmt: skip
    return json.dumps([kernel, block, change]), entry


def test_the_table_is_built_from_a_store_with_todays_kernel_sources_only(tmp_path):
    """Fake store entries of the real kernels: today's go into the H100's table; another
    source, another Triton, a CPU's, an entry stored before tables, are left out and counted.
    A second build merges: the older table's entries of today's sources stay."""
    today = tabled_kernels()
    assert set(today) == {"fp8_gemm", "fp8_conv2d", "depthwise"}
    assert len(set(today.values())) == 3  # each kernel its own hash: an edit stales its own
    store = tmp_path / "triton_tuning.json"
    entries = dict(
        [
            _stored("fp8_gemm", today["fp8_gemm"], 64),
            _stored("depthwise", today["depthwise"], 32),
            _stored("fp8_conv2d", "0" * 64, 64),  # tuned for an older conv
            _stored("fp8_gemm", today["fp8_gemm"], 16, triton="0.0.1"),
            _stored("fp8_gemm", today["fp8_gemm"], 8, gpu="cpu"),
        ]
    )
    entries["old"] = {"config": 3}
    store.write_text(json.dumps({"format": choices.FORMAT, "choices": entries}))
    out = tmp_path / "tables"
    built, skipped = table.build_tables(store, out, today)
    assert [(b.gpu, b.entries, b.from_store) for b in built] == [(H100, 2, 2)]
    assert skipped == {
        "tuned for another kernel source": 1,
        f"another Triton than {triton.__version__}": 1,
        "not tuned on a GPU": 1,
        "stored without what a table needs (before tables)": 1,
    }
    path = out / "nvidia-h100-80gb-hbm3.json"
    data = json.loads(path.read_text())
    assert (data["gpu"], data["triton"]) == (H100, triton.__version__)
    assert sorted(e["config"] for e in data["entries"]) == ["BLOCK: 32", "BLOCK: 64"]
    store.write_text(
        json.dumps({"format": 2, "choices": dict([_stored("fp8_gemm", today["fp8_gemm"], 128)])})
    )
    built, _ = table.build_tables(store, out, today)
    assert [(b.entries, b.from_store) for b in built] == [(3, 1)]  # merged with the first
    changed = today | {"depthwise": "1" * 64}  # the depthwise kernel edited since
    built, _ = table.build_tables(store, out, changed)
    assert [(b.entries, b.from_store) for b in built] == [(2, 1)]  # only its entry dropped


def test_the_command_builds_the_table_or_says_in_one_line_why_not(tmp_path, capsys):
    today = tabled_kernels()
    store = tmp_path / "store.json"
    assert main(["bench", "tuning-table", "--from", str(store)]) == 1
    assert "no tuning store there" in capsys.readouterr().err
    entries = dict([_stored("fp8_gemm", today["fp8_gemm"], 64)])
    store.write_text(json.dumps({"format": choices.FORMAT, "choices": entries}))
    out = tmp_path / "tables"
    assert main(["bench", "tuning-table", "--from", str(store), "--out", str(out)]) == 0
    assert "nvidia-h100-80gb-hbm3.json: NVIDIA H100 80GB HBM3, 1 entries" in capsys.readouterr().out
    store.write_text(json.dumps({"format": choices.FORMAT, "choices": {"k": {"config": 0}}}))
    assert main(["bench", "tuning-table", "--from", str(store), "--out", str(out)]) == 1
    assert "holds no choice a table keeps (1 stored without" in capsys.readouterr().err


KERNELS = '''
class Jit:
    def __init__(self, fn):
        self.fn = fn

SCALE = {scale}

@Jit
def helper(x):
    """{doc}"""
    return x * SCALE  # {comment}

@Jit
def first(x):
    return helper(x) + 1

@Jit
def second(x):
    return x - {other}
'''


def _kernels(tmp_path: Path, name: str, **values: object) -> tuple[str, str]:
    """The source hashes of `first` and `second` of the module `KERNELS` written with
    `values`."""
    fields = {"scale": 2, "doc": "Twice.", "comment": "a comment", "other": 1} | values
    path = tmp_path / f"{name}.py"
    path.write_text(KERNELS.format(**fields))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return kernel_source_sha(module.first), kernel_source_sha(module.second)


def test_a_kernels_source_hash_follows_what_it_and_its_callees_compute(tmp_path):
    """A docstring or comment keeps the hash; a changed constant it reads, or a change in a
    function it calls, changes it; an edit of another kernel leaves it."""
    first, second = _kernels(tmp_path, "k0")
    assert _kernels(tmp_path, "k1", doc="Doubled.", comment="moved") == (first, second)
    assert _kernels(tmp_path, "k2", scale=3)[0] != first  # a constant read by its callee
    assert _kernels(tmp_path, "k2b", scale=3)[1] == second  # ... which `second` does not read
    edited_first, edited_second = _kernels(tmp_path, "k3", other=2)  # `second` edited
    assert edited_first == first and edited_second != second
    with pytest.raises(TypeError, match="no Python function"):
        kernel_source_sha(object())
