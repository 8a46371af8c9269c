"""`quantstudy bench`: the record schema, the committed results re-rendered, and the parts of each
benchmark that run on a CPU (the speed harness as a check, shapes and bytes of depthwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantstudy.bench.report import REPORT_NAME, render_folder
from quantstudy.bench.schema import GemmBench, SpeedBench, read_folder, read_record, write_record
from quantstudy.bench.shapes import fp8_products
from quantstudy.cli import main
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import FASTEST, Activation
from tests.fp8_steps import more_than_one_e4m3_step

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")


@pytest.mark.committed("docs/results")
def test_committed_results_rerender_identically():
    """docs/results/README.md is what `quantstudy bench report docs/results --write` writes."""
    assert render_folder(RESULTS) == (RESULTS / REPORT_NAME).read_text()


@pytest.mark.committed("docs/results")
def test_committed_records_load_and_round_trip():
    records = read_folder(RESULTS)
    assert {type(r).__name__ for _, r in records} >= {"SpeedBench", "GemmBench", "PublishedBench"}
    for name, record in records:
        on_disk = json.loads((RESULTS / f"{name}.json").read_text())
        assert record.model_dump(mode="json", exclude_none=True) == on_disk, name
        assert record.provenance.command and record.provenance.device == "cuda", name
        if isinstance(record, SpeedBench):
            assert record.provenance.gpu_name == "NVIDIA H200", name


def test_a_file_that_is_no_record_is_a_user_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"kind": "speed", "provenance": {}}))
    with pytest.raises(UserError, match=r"x.json is not a bench record: speed.provenance"):
        read_record(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="holds no"):
        read_folder(empty)


@pytest.mark.committed("docs/results")
def test_gemm_shapes_match_the_products_the_h200_timed():
    """The products found on the CPU now are the 19 that the converted H200 sweep timed."""
    sweep = read_record(RESULTS / "gemm-tf_efficientnet_lite0-sweep.json")
    assert isinstance(sweep, GemmBench)
    found = fp8_products("tf_efficientnet_lite0", None, sweep.batch)
    assert [(p.m, p.k, p.n, p.layers) for p in found] == [
        (r.m, r.k, r.n, r.layers) for r in sweep.results
    ]
    for p, r in zip(found, sweep.results, strict=True):
        assert p.fused_bytes == r.fused_bytes == p.m * p.k + p.n * p.k + 2 * p.m * p.n


def test_depthwise_shapes_only_on_any_machine(tmp_path, capsys):
    dw_out = tmp_path / "dw.json"
    args = ["bench", "depthwise", "tf_efficientnet_lite0", "--batch", "2", "--shapes-only"]
    assert main([*args, "--out", str(dw_out)]) == 0
    dw = read_record(dw_out)
    assert not dw.meaningful and "nothing timed" in dw.meaningless_reason
    assert dw.bandwidth == 4.8e12  # no GPU to measure: the H200's datasheet HBM rate
    assert all(r.us == {} for r in dw.results)
    assert dw.provenance.command.startswith("quantstudy bench depthwise tf_efficientnet_lite0")
    assert sum(len(r.layers) for r in dw.results) == 16  # Lite0's 16 depthwise convs
    first = dw.results[0]
    assert first.input == [2, 32, 112, 112] and first.bytes["cudnn fp16"] == 2 * 2 * 32 * 112**2 * 2
    assert first.bytes["triton fp8 in/out"] == first.bytes["cudnn fp16"] // 2
    report = render_folder(tmp_path)
    assert "not meaningful as speed evidence" in report and "## Depthwise convolutions" in report


@NO_CUDA
def test_depthwise_timings_without_cuda_are_a_user_error(tmp_path, capsys):
    assert main(["bench", "depthwise", "ghostnet_100", "--out", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert "bench depthwise needs a CUDA GPU" in err and "--shapes-only" in err
    assert not (tmp_path / "r.json").exists()


@NO_CUDA
def test_kernels_without_cuda_is_a_user_error(tiny_imagenet, tmp_path, capsys):
    out = tmp_path / "k.json"
    code = main(["bench", "kernels", "m", "--data", str(tiny_imagenet), "--out", str(out)])
    assert code == 1 and "bench kernels needs a CUDA GPU" in capsys.readouterr().err


def test_speed_on_cpu_is_a_check_marked_not_meaningful(tiny_imagenet, tmp_path):
    out = tmp_path / "speed.json"
    args = ["bench", "speed", "test_efficientnet", "--weights", "random", "--device", "cpu"]
    args += ["--data", str(tiny_imagenet), "--calib", "4", "--heldout", "4", "--batches", "1"]
    args += ["--rounds", "2", "--iters", "1", "--agreement", "--out", str(out)]
    assert main(args) == 0
    record = read_record(out)
    assert isinstance(record, SpeedBench) and not record.meaningful
    assert record.provenance.device == "cpu" and record.provenance.gpu_name is None
    (result,) = record.results
    assert [e.fp8_kernel for e in result.engines] == ["fused", "scaled_mm"]
    assert all(e.speed.batches[0].batch == 1 and not e.speed.meaningful for e in result.engines)
    assert all(e.fp8_stepped_aside == 0 for e in result.engines)  # fused/scaled_mm keep none
    assert result.fused_vs_unfused.n_images == 4
    report = render_folder(tmp_path)
    assert "measured on a CPU" in report and "test_efficientnet" in report


def test_speed_refuses_agreement_without_both_engines(tiny_imagenet, tmp_path, capsys):
    args = ["bench", "speed", "m", "--device", "cpu", "--data", str(tiny_imagenet)]
    code = main([*args, "--kernels", "fused", "--agreement", "--out", str(tmp_path / "s.json")])
    assert code == 1 and "time both" in capsys.readouterr().err


@pytest.mark.committed("docs/results")
def test_report_command_prints_the_tables(capsys):
    assert main(["bench", "report", str(RESULTS)]) == 0
    out = capsys.readouterr().out
    assert out == (RESULTS / REPORT_NAME).read_text()


def test_every_bench_subcommand_comes_from_the_one_table(capsys):
    """`quantstudy bench` lists exactly `BENCHES`, each with its own `--help`; the lab tools of
    `tools/lab/bench/` are no subcommands."""
    from quantstudy.bench.cli import BENCHES
    from quantstudy.cli import main

    for name in BENCHES:
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", name, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: quantstudy bench {name}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "limit", "--help"])
    assert exit_info.value.code == 2 and "invalid choice: 'limit'" in capsys.readouterr().err


def test_unknown_arguments_elsewhere_are_still_refused(capsys):
    from quantstudy.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "report", "somewhere", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_cut_depthwise_run_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """Each finished row is written at once, marked unfinished until the last: a run cut by a
    time limit (as on the GPU machine) leaves a readable record of what it timed."""
    import quantstudy.bench.depthwise as dw

    real, calls = dw._row, []

    def cut_after_two(model, conv, bandwidth):
        calls.append(conv)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what `timeout` ends a run with, in effect
        return real(model, conv, bandwidth)

    monkeypatch.setattr(dw, "_row", cut_after_two)
    out = tmp_path / "dw.json"
    with pytest.raises(KeyboardInterrupt):
        dw.bench_depthwise("tf_efficientnet_lite0", 2, shapes_only=True, out=out)
    partial = read_record(out)
    assert len(partial.results) == 2 and partial.unfinished == "10 of 12 convs not timed yet"
    assert "**unfinished** (the run was cut): 10 of 12" in render_folder(tmp_path)


def test_layers_kept_in_fp16_are_counted_beside_the_fp8_layers(tmp_path):
    """A `fastest` engine that kept layers in fp16 says how many beside its real/emulated count,
    so a speed-up is never read as the whole recipe's when part of it ran fp16."""
    record = read_record(RESULTS / "speed-tf_efficientnet_lite0-fused.json")
    assert isinstance(record, SpeedBench)
    result = record.results[0]
    update = {"fp8_kernel": FASTEST, "fp8_stepped_aside": 3}
    engine = result.engines[0].model_copy(update=update)
    kept = result.model_copy(update={"engines": [engine]})
    write_record(tmp_path / "speed.json", record.model_copy(update={"results": [kept]}))
    assert f"{engine.fp8_real}/{engine.fp8_emulated} +3 fp16" in render_folder(tmp_path)
    plain = result.engines[0]
    assert plain.fp8_stepped_aside is None  # an older record: nothing counted, nothing shown
    assert f"{plain.fp8_real}/{plain.fp8_emulated} |" in render_folder(RESULTS)


def test_products_are_distinct_across_models_and_kept_per_batch():
    """`bench products` times each product once per batch, naming every model that has it and
    counting its layers across them; kxk convs come as their implicit GEMM."""
    from quantstudy.bench.products import _distinct
    from quantstudy.study.model_list import ModelEntry

    vit = ModelEntry(name="test_vit", recipe="generic_linears")
    rows = _distinct([vit, vit], [1, 4])
    assert rows and {r.batch for r in rows} == {1, 4}
    one = [r for r in rows if r.batch == 1]
    assert [r.m * 4 for r in one] == [r.m for r in rows if r.batch == 4]
    found = fp8_products("test_vit", "generic_linears", 1)
    assert [(r.m, r.k, r.n, r.layers) for r in one] == [
        (p.m, p.k, p.n, 2 * len(p.layers)) for p in found
    ]  # the model named twice: the same products, their layers counted twice, one model named
    assert all(r.models == ["test_vit"] and r.flop == 2.0 * r.m * r.k * r.n for r in rows)
    convs = _distinct([ModelEntry(name="resnet18", recipe="generic_dense_convs")], [2])
    kxk = [r for r in convs if r.kind == "conv"]
    assert kxk and all(r.k == r.conv[0] * r.conv[3] * r.conv[4] for r in kxk)


@NO_CUDA
def test_products_without_cuda_is_a_user_error(tmp_path, capsys):
    assert main(["bench", "products", "--out", str(tmp_path / "p.json")]) == 1
    assert "bench products needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.committed("docs/results")
def test_products_sums_count_each_layer_of_the_committed_record():
    """The per-model sums of the products table weight each product by its layers."""
    from quantstudy.bench.products_table import products_section
    from quantstudy.bench.schema import ProductsBench

    rec = read_record(RESULTS / "products-h100-59c0b6d.json")
    assert isinstance(rec, ProductsBench)
    vit = [r for r in rec.results if r.models == ["vit_base_patch16_224"] and r.batch == 128]
    assert sum(r.layers for r in vit) == 48
    ms = sum(r.us["cuBLASLt"] * r.layers for r in vit) / 1e3
    line = next(
        x for x in products_section("p", rec, []) if x.startswith("| vit_base_patch16_224 | 128")
    )
    assert f"| {ms:.2f} |" in line


@pytest.mark.committed("docs/results")
def test_products_table_shows_cublaslt_with_the_engine_epilogues():
    """A product timed as cuBLASLt's product then an epilogue kernel gets a column of its own
    beside ours with the same epilogue; a record without it renders as before."""
    from quantstudy.bench.products_table import products_section
    from quantstudy.bench.schema import ProductsBench

    rec = read_record(RESULTS / "products-h100-f79d41d-epilogues.json")
    assert isinstance(rec, ProductsBench)
    before = products_section("p", rec, [])
    label = "cuBLASLt + Inductor with-gelu fp8-out"
    first = rec.results[0].model_copy(update={"us": {**rec.results[0].us, label: 123.4}})
    rec2 = rec.model_copy(update={"results": [first, *rec.results[1:]]})
    lines = products_section("p", rec2, [])
    head = next(x for x in lines if x.startswith("| kind |"))
    assert f"| {label} us |" in head and f"| {label} us |" not in "".join(before)
    cells = [x for x in lines if x.startswith("| matmul |")]
    assert "| 123.4 |" in cells[0] and all("| - | ours" in c for c in cells[1:])


def test_cublaslt_epilogue_is_the_fused_epilogue_after_its_scales_and_bias():
    """On cuBLASLt's fp16 product: the activation in float32, rounded to fp16, then the next
    layer's FP8 input; no FP8 out gives the fp16 activation (the fused kernel's order)."""
    from quantstudy.bench.product_columns import cublaslt_epilogue
    from quantstudy.quant.formats.fp8 import to_fp8

    g = torch.Generator().manual_seed(0)
    y16 = (torch.randn(64, 48, generator=g) * 4).half()
    scale = torch.tensor(0.02)
    gelu16 = torch.nn.functional.gelu(y16.float()).half()
    assert torch.equal(cublaslt_epilogue(y16, scale, Activation.GELU, False), gelu16)
    out = cublaslt_epilogue(y16, scale, Activation.GELU, True)
    assert out.dtype == torch.float8_e4m3fn and torch.equal(
        out.float(), to_fp8(gelu16, scale).float()
    )
    assert torch.equal(cublaslt_epilogue(y16, scale, Activation.NONE, True).float(),
                       to_fp8(y16, scale).float())  # fmt: skip
    assert out.float().abs().max() == 448.0  # saturated, not inf: 16.4 / 0.02 > 448


def test_the_compiled_cublaslt_epilogue_rounds_once_at_most_a_step_off():
    """Inductor's kernel of the epilogue (the bench's column, compiled as an engine is) keeps
    the activation in float32 and rounds it once, to FP8, where the eager steps round to fp16
    first. The two part only where the fp16 value lands on a midpoint of the FP8 grid, one fp16
    value in 2^7 between FP8 steps and half of those rounding the other way: at most about 2^-8
    of the outputs, one FP8 step each. Measured here 0.0018 (torch 2.11 and 2.14, CPU)."""
    from quantstudy.bench.product_columns import _compiled_epilogue, cublaslt_epilogue

    g = torch.Generator().manual_seed(0)
    y16 = (torch.randn(1024, 512, generator=g) * 3).half()
    scale = torch.tensor(0.01)
    eager = cublaslt_epilogue(y16, scale, Activation.GELU, True).float()
    compiled = _compiled_epilogue(Activation.GELU, True)(y16, scale).float()
    differ = (eager != compiled).float().mean().item()
    assert differ <= 2**-8, differ
    assert not (far := more_than_one_e4m3_step(compiled, eager)), far


def test_products_bad_input_is_one_line(tmp_path, capsys):
    """A batch below 1 and a --resume record of another kind are refused before anything runs."""
    from quantstudy.bench.products import _resumed

    out = tmp_path / "p.json"
    assert main(["bench", "products", "--batches", "0,128", "--out", str(out)]) == 1
    assert "--batches must be at least 1" in capsys.readouterr().err and not out.exists()
    with pytest.raises(UserError, match="is a gemm record, not a products record"):
        _resumed(RESULTS / "gemm-tf_efficientnet_lite0-sweep.json")
    assert _resumed(tmp_path / "none-yet.json") == []  # a first run resumes from nothing
