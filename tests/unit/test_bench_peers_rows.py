"""A peers row's own commit, engine-sources hash and phases: rows of several commits join one
record where the code that makes their numbers is the same, and each row says where its
seconds went. CPU runs of timm's tiny test model (the GPU parts are the same code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import quantstudy.bench.peers.run as peers_run
import quantstudy.bench.peers.torchao as peers_torchao
from quantstudy.bench.peers.alike import ROW_SOURCES, check_code, merging
from quantstudy.bench.peers.phases import RowClock
from quantstudy.bench.peers.table import peers_section, peers_table, phase_table
from quantstudy.bench.schema import PeersBench, PeersResult, RowStep, read_record, write_record
from quantstudy.cli import main
from quantstudy.quant.kernels import tuning
from quantstudy.record.errors import UserError
from quantstudy.study.sources import engine_sources_sha256

A, B = "a" * 40, "b" * 40


def _peers(data, out, *extra):
    args = ["bench", "peers", "test_efficientnet", "--weights", "random", "--device", "cpu"]
    args += ["--data", str(data), "--calib", "4", "--heldout", "4", "--batches", "1,2"]
    return main([*args, "--rounds", "2", "--iters", "1", "--out", str(out), *extra])


@pytest.fixture
def no_torchao(monkeypatch):
    monkeypatch.setattr(peers_torchao, "torchao_version", lambda: None)
    monkeypatch.setattr(peers_run, "torchao_version", lambda: None)


def test_rows_of_two_commits_join_where_their_engine_sources_are_the_same(
    tiny_imagenet, tmp_path, monkeypatch, capsys, no_torchao
):
    """Commit A measures a row, commit B (same sources) appends another and merges with A's:
    one record, each row naming its commit; another hash is refused in one line, nothing
    written."""
    out, parts = tmp_path / "peers.json", []
    for commit, recipe in ((A, "generic_pointwise"), (B, "generic_dense_convs")):
        monkeypatch.setenv("QUANTSTUDY_GIT_COMMIT", commit)
        part = tmp_path / f"{commit[0]}.json"
        assert _peers(tiny_imagenet, part, "--recipe", recipe) == 0
        assert _peers(tiny_imagenet, out, "--recipe", recipe, "--append") == 0
        parts.append(str(part))
    record = read_record(out)
    assert isinstance(record, PeersBench) and record.provenance.git_commit == A
    sources = engine_sources_sha256(covered=ROW_SOURCES)
    assert [(r.git_commit, r.engine_sources) for r in record.results] == [
        (A, sources), (B, sources)
    ]  # fmt: skip
    assert record.provenance.code == (
        f"rows measured at commits aaaaaaa, bbbbbbb, with the same engine sources "
        f"{sources[:12]}; each row names its commit"
    )
    lines = peers_table(record)
    assert (
        f"- test_efficientnet: measured at commit aaaaaaa, engine sources {sources[:12]}" in lines
    )
    assert (
        f"- test_efficientnet: measured at commit bbbbbbb, engine sources {sources[:12]}" in lines
    )
    merged = tmp_path / "merged.json"
    assert main(["bench", "peers-merge", *parts, "--out", str(merged)]) == 0
    assert read_record(merged).provenance.code == record.provenance.code
    capsys.readouterr()

    monkeypatch.setattr(peers_run, "engine_sources_sha256", lambda covered: "c" * 64)
    before = out.read_bytes()
    assert _peers(tiny_imagenet, out, "--recipe", "generic_linears", "--append") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"engine sources {sources[:12]} (commit aaaaaaa)" in err
    assert "this run's with cccccccccccc (commit bbbbbbb)" in err and out.read_bytes() == before


def _older(record: PeersBench, commit: str) -> PeersBench:
    """`record` as a record written before rows carried their commit and hash."""
    rows = [
        r.model_copy(update={"git_commit": None, "engine_sources": None, "phases": None})
        for r in record.results
    ]
    provenance = record.provenance.model_copy(update={"git_commit": commit})
    return record.model_copy(update={"results": rows, "provenance": provenance})


def test_a_row_without_the_hash_joins_only_rows_of_its_own_commit(
    tiny_imagenet, tmp_path, monkeypatch, capsys, no_torchao
):
    monkeypatch.setenv("QUANTSTUDY_GIT_COMMIT", A)
    new = tmp_path / "new.json"
    assert _peers(tiny_imagenet, new, "--recipe", "generic_dense_convs") == 0
    record = read_record(new)
    assert isinstance(record, PeersBench)
    row = record.results[0]
    other = row.model_copy(update={"recipe": "builtin:generic_pointwise"})
    for commit, code in ((A, 0), (B, 1)):
        old = tmp_path / f"old-{commit[0]}.json"
        write_record(old, _older(record.model_copy(update={"results": [other]}), commit))
        merged = tmp_path / f"merged-{commit[0]}.json"
        assert main(["bench", "peers-merge", str(old), str(new), "--out", str(merged)]) == code
    assert "joins only rows of its own commit" in capsys.readouterr().err
    # the older row reads as it was written: no commit, hash or phases of its own
    old_row = read_record(tmp_path / "merged-a.json").results[0]
    assert (old_row.git_commit, old_row.engine_sources, old_row.phases) == (None, None, None)
    assert "engine_sources" not in json.loads((tmp_path / "old-b.json").read_text())["results"][0]


def test_the_code_of_rows_side_by_side():
    check_code([(A, "h"), (B, "h")], [(B, "h"), ("c", "h")])  # one hash: any commits
    check_code([(A, None)], [(A, "h"), (A, None)])  # no hash: one commit
    for held, new in (
        ([(A, "h")], [(A, "g")]),
        ([(A, None)], [(B, "h")]),
        ([(A, "h")], [(B, None)]),
    ):
        with pytest.raises(UserError):
            check_code(held, new)


def test_a_merge_refusal_names_both_files():
    """`peers-merge`: the file whose rows differ and the first file, and no --out to give."""
    sides = merging(Path("gpu0.json"), Path("gpu1.json"))
    with pytest.raises(UserError) as said:
        check_code([(A, "h")], [(B, "g")], sides)
    line = str(said.value)
    assert line.startswith("gpu0.json's rows were measured with engine sources h (commit a")
    assert "gpu1.json's with g (commit b" in line and "--out" not in line


def test_a_row_says_where_its_seconds_went(tiny_imagenet, tmp_path, capsys, no_torchao):
    """Every part of a CPU row: the preparation's three stages, each engine's build, its first
    call at each batch and its quality pass, the timing rounds of every batch (no kernel profile
    on a CPU), the parts adding up to no more than the row's seconds; printed as each ends and as
    a table after the row."""
    out = tmp_path / "peers.json"
    assert _peers(tiny_imagenet, out) == 0
    printed = capsys.readouterr().out
    (row,) = read_record(out).results
    assert row.phases is not None
    found = {(p.step, p.engine, p.batch, p.detail) for p in row.phases}
    engines = ("fp16", "quantstudy fused")
    want = {(RowStep.PREPARE, None, None, d) for d in ("load", "images", "calibrate")}
    want |= {(RowStep.BUILD, e, None, None) for e in engines}
    want |= {(RowStep.COMPILE, e, b, None) for e in engines for b in (1, 2)}
    want |= {(RowStep.TIMING, None, None, "rounds and kernel profiles, every batch")}
    want |= {(RowStep.QUALITY, e, 2, None) for e in ("fp32", *engines)}
    assert found == want
    assert all(p.seconds >= 0 for p in row.phases)
    assert sum(p.seconds for p in row.phases) <= row.seconds
    assert "  compile quantstudy fused at 2: " in printed and "  prepare calibrate: " in printed
    table = phase_table(row)
    assert table[0].startswith(f"where the {row.seconds:.1f} s of test_efficientnet's row went")
    assert table[1] == (
        "| engine | prepare | build | compile at 1 | compile at 2 | timing | quality at 2 | sum |"
    )
    assert [line.split(" | ")[0] for line in table[3:]] == [
        "| (row)", "| fp16", "| quantstudy fused", "| fp32"
    ]  # fmt: skip
    assert "\n".join(table) in printed
    section = "\n".join(peers_section("p", read_record(out), []))  # `bench report` renders it
    assert "\n".join(table) in section
    old = row.model_copy(update={"phases": None})
    assert phase_table(old) == [] and PeersResult.model_validate_json(old.model_dump_json()) == old


def test_a_part_holds_its_autotuners_share(monkeypatch):
    """The autotuner's seconds of a part are what its log gained inside that part (the kernel
    choice of `fastest`, with its tuning, stays inside that engine's build)."""
    monkeypatch.setattr(tuning, "TUNE_LOG", [])
    import quantstudy.bench.peers.phases as phases

    monkeypatch.setattr(phases, "TUNE_LOG", tuning.TUNE_LOG)
    ticks = iter([0.0, 10.0, 20.0, 23.0])
    monkeypatch.setattr(phases.time, "perf_counter", lambda: next(ticks))
    echoed: list[str] = []
    clock = RowClock(echo=echoed.append)
    with clock.phase(RowStep.BUILD, "quantstudy fastest"):
        tuning.TUNE_LOG.append({"compile_s": 1.0, "tune_s": 0.5})  # the kernel choice's
        tuning.TUNE_LOG.append({"compile_s": 0.25, "tune_s": 0.25})
    with clock.phase(RowStep.COMPILE, "quantstudy fastest", 128):
        tuning.TUNE_LOG.append({"compile_s": 2.0, "tune_s": 0.0})
    assert [(p.step, p.seconds, p.autotune_s) for p in clock.phases] == [
        (RowStep.BUILD, 10.0, 2.0),
        (RowStep.COMPILE, 3.0, 2.0),
    ]
    assert echoed == [
        "  build quantstudy fastest: 10.0 s (2.0 s autotuning)",
        "  compile quantstudy fastest at 128: 3.0 s (2.0 s autotuning)",
    ]
