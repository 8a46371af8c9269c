"""`quantstudy bench peers`: which recipe layers each torchao config takes, the one-line refusals,
the record a CPU run writes (fp16 and our FP8 engine, timings marked not meaningful), rows added
to a record measured alike, and torchao's static float8 config really run on the CPU where
torchao is installed (its dynamic configs quantize only on a CUDA GPU)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import quantstudy.bench.peers.run as peers_run
import quantstudy.bench.peers.torchao as peers_torchao
from quantstudy.bench.peers.alike import read_rows, row_config
from quantstudy.bench.peers.configs import (
    Peer,
    device_refusal,
    parse_version,
    peer_layers,
    torchao_refusal,
)
from quantstudy.bench.peers.table import peers_table
from quantstudy.bench.report import render_folder
from quantstudy.bench.schema import (
    PeerEngine,
    PeerRefused,
    PeersBench,
    PeersResult,
    Provenance,
    read_record,
    write_record,
)
from quantstudy.cli import main
from quantstudy.engines.base import Engine
from quantstudy.quality.metrics import score_engine
from quantstudy.record import (
    BatchSpeed,
    IdealSpeed,
    LayerDecision,
    SpeedSection,
    StudyConfig,
    TimingStats,
)
from quantstudy.record.errors import UserError
from quantstudy.speed.harness import measure_speed
from quantstudy.study.model_list import ModelEntry


def _layer(name, op, cin, cout, kernel=(1, 1), groups=1) -> LayerDecision:
    return LayerDecision(
        name=name, op=op, module_class="Linear" if op == "linear" else "Conv2d",
        kernel=None if op == "linear" else kernel, groups=groups, in_channels=cin,
        out_channels=cout, input_hw=(1, 1), selected=True, reason="test",
    )  # fmt: skip


LAYERS = [
    _layer("qkv", "linear", 64, 192),
    _layer("head", "linear", 64, 1000),  # 1000 = 62 x 16 + 8: torch._scaled_mm refuses it
    _layer("pw", "conv2d", 32, 64),
    _layer("k3", "conv2d", 64, 64, kernel=(3, 3)),
    _layer("dw", "conv2d", 32, 32, kernel=(3, 3), groups=32),
]


def test_each_config_takes_the_recipe_layers_torchao_quantizes():
    for peer in Peer:
        taken, left = peer_layers(peer, LAYERS, conv_fp8=False)
        assert taken == ["qkv"], peer  # no FP8 conv without mslk on compute capability 10.0
        assert "multiples of 16" in left["head"] and set(left) == {"head", "pw", "k3", "dw"}
    taken, left = peer_layers(Peer.DYNAMIC_TENSOR, LAYERS, conv_fp8=True)
    assert taken == ["qkv", "pw", "k3"] and "groups=1 only" in left["dw"]
    for peer in (Peer.DYNAMIC_ROW, Peer.STATIC_TENSOR):  # per-tensor dynamic is its only conv path
        taken, left = peer_layers(peer, LAYERS, conv_fp8=True)
        assert taken == ["qkv"] and "linear layers only" in left["pw"]
    assert "mslk" in peer_layers(Peer.DYNAMIC_TENSOR, LAYERS, conv_fp8=False)[1]["pw"]


def test_torchao_refusals_are_one_line_each():
    absent = torchao_refusal(None, "2.14.1")
    assert absent is not None and "pip install 'quantstudy[peers]'" in absent
    old = torchao_refusal("0.16.0", "2.14.1")
    assert old is not None and "older than 0.17" in old
    torch_old = torchao_refusal("0.18.0", "2.10.0+cu128")
    assert torch_old is not None and "needs torch >= 2.11" in torch_old
    assert torchao_refusal("0.18.0+cu130", "2.11.0+cu130") is None
    assert parse_version("2.11.0+cu130") == (2, 11, 0) and parse_version("0.18.0.dev1") == (
        0,
        18,
        0,
    )
    cpu = device_refusal(Peer.DYNAMIC_ROW, "cpu")
    assert cpu is not None and "CUDA GPU" in cpu and "CPU" in cpu
    assert device_refusal(Peer.STATIC_TENSOR, "cpu") is None  # torch._scaled_mm runs on a CPU
    assert all(device_refusal(p, "cuda") is None for p in Peer)
    for line in (absent, old, torch_old, cpu):
        assert "\n" not in line


def _peers(data, out, *extra):
    """`bench peers` on a CPU; `extra` (the model, or --rows, and options) goes last, so that
    its options win."""
    args = ["bench", "peers", "--weights", "random", "--device", "cpu", "--data", str(data)]
    args += ["--calib", "4", "--heldout", "4", "--batches", "1", "--rounds", "2", "--iters", "1"]
    return main([*args, "--out", str(out), *extra])


def _without_torchao(monkeypatch):
    monkeypatch.setattr(peers_torchao, "torchao_version", lambda: None)
    monkeypatch.setattr(peers_run, "torchao_version", lambda: None)


def test_a_cpu_run_records_fp16_and_our_engine_and_refuses_torchao_in_one_line(
    tiny_imagenet, tmp_path, monkeypatch, capsys
):
    _without_torchao(monkeypatch)
    out = tmp_path / "peers.json"
    assert _peers(tiny_imagenet, out, "test_efficientnet") == 0
    printed = capsys.readouterr().out
    assert printed.count("refused:") == 2  # the line as it happens, and the table's note
    record = read_record(out)
    assert isinstance(record, PeersBench) and not record.meaningful
    assert "measured on a CPU" in record.meaningless_reason and record.unfinished is None
    p = record.provenance
    assert p.device == "cpu" and p.torchao is None and p.torch == torch.__version__
    assert p.command.startswith("quantstudy bench peers --weights random")
    assert p.command.endswith("peers.json test_efficientnet")
    assert (record.batches, record.quality_batch) == ([1], 1)
    (row,) = record.results
    assert (row.model, row.weights, row.recipe) == (
        "test_efficientnet", "random", "builtin:generic_pointwise"
    )  # fmt: skip
    assert row.selected == 7 and (row.n_calib, row.n_images) == (4, 4)  # its 7 1x1 convs
    fp16, ours = row.engines
    assert (fp16.name, fp16.provider, fp16.speed) == ("fp16", "fp16", None)
    assert (ours.name, ours.provider, ours.fp8_layers, ours.half_layers) == (
        "quantstudy fused", "quantstudy", 7, {}
    )  # fmt: skip
    assert fp16.compute_dtype == ours.compute_dtype == "bfloat16"  # the CPU's half dtype
    assert not ours.speed.meaningful and ours.speed.batches[0].batch == 1
    region = ours.speed.timed_region
    assert "the rounds of fp16, quantstudy fused alternate in ABBA order" in region
    assert ours.speed.ideal is None and "needs GPU timings" in ours.ideal_missing
    for e in (fp16, ours):
        assert e.quality.n_images == 4 and 0 <= e.quality.agreement <= 1
        assert e.quality.kl_mean >= 0 and e.quality.engine == e.name
    (refused,) = row.refused
    assert refused.name == "torchao" and "is not installed" in refused.reason
    report = render_folder(tmp_path)
    assert "## Side by side: fp16, our FP8 engine, torchao" in report
    assert "| test_efficientnet | quantstudy fused | 7/7 |" in report
    assert "| test_efficientnet | torchao | refused |" in report


def test_rows_join_a_record_measured_alike(tiny_imagenet, tmp_path, monkeypatch, capsys):
    """A rows file measured a row a command: the record says which rows are still to come, the
    next command adds one and skips the one it holds, and a run timed otherwise is refused
    before it measures anything. torchao is taken as installed and usable: on a CPU its dynamic
    configs are refused, and the static one takes none of a conv recipe's layers, so no torchao
    engine is built."""
    _without_torchao(monkeypatch)
    monkeypatch.setattr(peers_run, "torchao_status", lambda: None)
    rows = tmp_path / "rows.yaml"
    rows.write_text(
        "rows:\n  - {model: test_efficientnet}\n"
        "  - {model: test_efficientnet, recipe: generic_dense_convs}\n"
    )
    out = tmp_path / "peers.json"
    one_row = ("--rows", str(rows), "--append", "--max-rows", "1")
    assert _peers(tiny_imagenet, out, *one_row) == 0
    record = read_record(out)
    assert record.unfinished == "1 of 2 rows not measured yet: test_efficientnet"
    assert _peers(tiny_imagenet, out, *one_row) == 0
    assert "already in" in capsys.readouterr().out
    record = read_record(out)
    assert record.unfinished is None
    assert [r.recipe for r in record.results] == [
        "builtin:generic_pointwise", "builtin:generic_dense_convs"
    ]  # fmt: skip
    second = record.results[1]
    assert "--rows" in second.command and second.selected >= 1
    reasons = {r.name: r.reason for r in second.refused}
    assert set(reasons) == {p.label for p in Peer}
    assert "only on a CUDA GPU" in reasons["torchao dynamic per-row"]
    assert "takes none of the recipe's" in reasons["torchao static per-tensor"]
    assert "linear layers only" in reasons["torchao static per-tensor"]
    before = out.read_bytes()
    assert _peers(tiny_imagenet, out, *one_row, "--rounds", "3") == 1
    assert "timed with rounds 2, this run with 3" in capsys.readouterr().err
    assert out.read_bytes() == before
    _merge_checks(record, tmp_path, capsys)


def _merge_checks(record: PeersBench, tmp_path, capsys) -> None:
    """Rows measured into separate records (the GPUs of one host side by side) merge into the
    record one command would have written; a record measured otherwise and a row held twice
    are refused in one line, writing nothing."""
    parts = []
    for i, row in enumerate(record.results):
        part = tmp_path / f"part{i}.json"
        write_record(part, record.model_copy(update={"results": [row]}))
        parts.append(str(part))
    merged = tmp_path / "merged.json"
    assert main(["bench", "peers-merge", *parts, "--out", str(merged)]) == 0
    assert read_record(merged) == record
    other = record.provenance.model_copy(update={"gpu_name": "another GPU"})
    write_record(tmp_path / "other.json", record.model_copy(update={"provenance": other}))
    switched = record.provenance.model_copy(update={"lab_switches": "X=0"})
    write_record(tmp_path / "switched.json", record.model_copy(update={"provenance": switched}))
    for given, message in (
        ([parts[0], str(tmp_path / "other.json")], "measured with gpu_name"),
        ([parts[0], str(tmp_path / "switched.json")], "measured with lab_switches None"),
        ([parts[0], str(merged)], "is also in an earlier record; merge each row once"),
    ):
        assert main(["bench", "peers-merge", *given, "--out", str(tmp_path / "x.json")]) == 1
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_rows_file_and_its_mistakes(tmp_path, capsys):
    """A rows file is a model list (`study/model_list.py`); the older `rows:`/`model:` reads."""
    rows = tmp_path / "rows.yaml"
    (tmp_path / "w.pth").write_bytes(b"")
    rows.write_text(
        "rows:\n  - {model: test_vit, recipe: generic_linears}\n"
        "  - {model: test_resnet, weights: w.pth}\n"
    )
    found = read_rows(rows)
    assert found == (
        ModelEntry(name="test_vit", recipe="generic_linears"),
        ModelEntry(name="test_resnet", weights=str(tmp_path / "w.pth")),
    )
    base = StudyConfig(model="x", data=str(tmp_path), weights="random", calib=8, recipe="r")
    a, b = (row_config(base, r) for r in found)
    assert (a.model, a.recipe, a.weights, a.calib) == ("test_vit", "generic_linears", "random", 8)
    assert (b.model, b.recipe, b.weights) == ("test_resnet", "r", str(tmp_path / "w.pth"))
    for text, message in (
        ("models: []\n", "line 1: models: is empty"),
        ("models:\n  - {name: test_vit, recpie: x}\n", "line 2: models.0.recpie: unknown key"),
        ("rows:\n  - {model: test_vit}\n  - {model: test_vit}\n", "rows.1.name: test_vit is"),
        # a name timm does not have, refused as the file is read, not when its row starts
        ("models:\n  - {name: test_vit}\n  - {name: test_vitt}\n", "line 3: models.1.name: unk"),
        ("models:\n  - {name: test_vit, weights: gone.pth}\n", "models.0.weights: checkpoint"),
        ("models:\n  - {name: test_vit, recipe: no_such}\n", "models.0.recipe: unknown recipe"),
    ):
        rows.write_text(text)
        with pytest.raises(UserError, match=message):
            read_rows(rows)
    out = str(tmp_path / "r.json")
    assert main(["bench", "peers", "--device", "cpu", "--data", str(tmp_path), "--out", out]) == 1
    assert "give a MODEL or --rows FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "peers", "m", "--torchao", "dynamic_row,bogus", "--out", out])
    assert "--torchao takes distinct names from" in capsys.readouterr().err


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 48), nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_torchao_static_config_runs_fp8_on_exactly_the_chosen_linears_on_cpu():
    """torchao's static per-tensor config on a CPU (torch._scaled_mm has a CPU kernel): the
    filter's layers are FP8 products afterwards, the one it leaves out is untouched."""
    pytest.importorskip("torchao")
    from torchao.utils import TorchAOBaseTensor

    torch.manual_seed(0)
    model = _Tiny().to(torch.bfloat16).eval()
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x).float()
    decisions = [_layer("a", "linear", 32, 64), _layer("b", "linear", 64, 48)]
    decisions.append(_layer("c", "linear", 48, 10))
    taken, left = peer_layers(Peer.STATIC_TENSOR, decisions, conv_fp8=False)
    assert taken == ["a", "b"] and list(left) == ["c"]
    assert peers_torchao.quantize_module(model, Peer.STATIC_TENSOR, taken, [x]) == ["a", "b"]
    for name in taken:
        weight = model.get_submodule(name).weight
        assert isinstance(weight, TorchAOBaseTensor) and weight.qdata.dtype == torch.float8_e4m3fn
    assert not isinstance(model.c.weight, TorchAOBaseTensor)
    with torch.no_grad():
        got = model(x).float()
    # e4m3 keeps 3 mantissa bits: each input and weight rounds by at most 2^-4 relative; over
    # two layers of 32 and 64 terms the output's L2 error stays far under 10% of its norm, and
    # it is not 0 (a path that skipped FP8 would match the bfloat16 model exactly).
    error = float((got - want).norm() / want.norm())
    assert 0 < error < 0.1, error


@pytest.mark.slow
def test_a_cpu_run_with_torchao_times_and_scores_its_static_engine(tiny_imagenet, tmp_path):
    """The whole bench with torchao's static engine on the CPU (its torch._scaled_mm is a slow
    reference kernel there: tens of seconds on test_vit)."""
    pytest.importorskip("torchao")
    out = tmp_path / "peers.json"
    assert _peers(tiny_imagenet, out, "test_vit", "--recipe", "generic_linears") == 0
    record = json.loads(out.read_text())
    (row,) = record["results"]
    static = next(e for e in row["engines"] if e["name"] == "torchao static per-tensor")
    assert static["fp8_layers"] == 24 and static["compute_dtype"] == "bfloat16"
    assert static["quality"]["n_images"] == 4 and "speed" in static
    assert {r["name"] for r in row["refused"]} == {
        "torchao dynamic per-row",
        "torchao dynamic per-tensor",
    }
    assert record["provenance"]["torchao"]


class _Engine(Engine):
    """An engine around a module on the CPU, for the harness alone."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name, self.module, self.eager = name, module, module
        self.device, self.dtype, self.channels_last = torch.device("cpu"), torch.float32, False

    def info(self):
        raise NotImplementedError


def test_every_engine_is_paired_with_the_same_fp16_rounds():
    engines = {"fp16": _Engine("fp16", nn.Conv2d(3, 4, 1))}
    engines |= {n: _Engine("fp8", nn.Conv2d(3, 4, 3)) for n in ("ours", "theirs")}
    images = torch.rand(2, 3, 8, 8)
    sections = measure_speed(engines, images, [1, 2], rounds=3, iters=2, compile_mode="default")
    assert list(sections) == ["ours", "theirs"]
    ours, theirs = sections["ours"], sections["theirs"]
    assert [b.batch for b in ours.batches] == [1, 2] and not ours.meaningful
    for a, b in zip(ours.batches, theirs.batches, strict=True):
        assert a.fp16_ms == b.fp16_ms  # one set of rounds: the same fp16 timings in each section
        assert a.ratio.n == ours.rounds == 3
    assert "the rounds of fp16, ours, theirs alternate in ABBA order" in ours.timed_region
    assert ours.weight_bytes == {"fp16": 4 * (3 * 4 + 4), "fp8": 4 * (3 * 4 * 9 + 4)}


def _timing(median, q1, q3):
    return TimingStats(median=median, q1=q1, q3=q3, min=q1, max=q3, n=30)


def _peer(name, provider, ratio, ideal=None, missing=None):
    batch = BatchSpeed(
        batch=128, fp16_ms=_timing(2.5, 2.49, 2.51), fp8_ms=_timing(2.0, 1.99, 2.01),
        ratio=_timing(*ratio), warnings=[],
    )  # fmt: skip
    ideals = None
    if ideal is not None:
        ideals = [
            IdealSpeed(
                batch=128, peaks="H200", layers=48, fp16_products_us=1, fp16_elementwise_us=0,
                fp8_roofline_us=1, fp16_ms=2.5, ideal_x=ideal, measured_x=ratio[0],
                fraction=ratio[0] / ideal,
            )
        ]  # fmt: skip
    speed = SpeedSection(
        device="cuda:0 (NVIDIA H200)", meaningful=True, compile_mode="default", timed_region="t",
        rounds=30, iters_per_round=20, warmup=10, input_buffers=1, clocks={}, batches=[batch],
        kernels=[], weight_bytes={}, ideal=ideals,
    )  # fmt: skip
    quality = score_engine(name, torch.eye(4), torch.eye(4) + 0.01 * torch.arange(4.0), None)
    return PeerEngine(
        name=name, provider=provider, built="b", compute_dtype="float16", fp8_layers=48,
        half_layers={}, speed=speed, ideal_missing=missing, quality=quality,
    )  # fmt: skip


def test_the_table_puts_each_x_beside_the_ideal_and_the_fraction_reached():
    fp16 = _peer("fp16", "fp16", (1.0, 1.0, 1.0)).model_copy(update={"speed": None})
    ours = _peer("quantstudy fused", "quantstudy", (1.19, 1.17, 1.21), ideal=2.38)
    theirs = _peer("torchao dynamic per-row", "torchao", (1.05, 1.01, 1.08), missing="ideal x (x)")
    row = PeersResult(
        model="vit_base_patch16_224", weights="random", recipe="builtin:generic_linears",
        selected=48, command="c", images="i", n_calib=100, n_images=4, seconds=1.0,
        engines=[fp16, ours, theirs],
        refused=[PeerRefused(name="torchao static per-tensor", reason="why")],
    )  # fmt: skip
    record = PeersBench(
        provenance=Provenance(command="c", device="cuda"), meaningful=True, batches=[128],
        rounds=30, iters=20, compile_mode="default", quality_batch=128, results=[row],
    )  # fmt: skip
    lines = peers_table(record)
    assert lines[0] == (
        "| model | engine | FP8 layers | x at 128 [q1-q3] | ideal x at 128 (reached) | "
        "agreement with fp32 | KL mean |"
    )
    assert "| vit_base_patch16_224 | fp16 | - | 2.500 ms | - | 1.0000 (4/4) |" in lines[2]
    assert "| quantstudy fused | 48/48 | 1.19 [1.17-1.21] | 2.38 (50%) | 1.0000 (4/4) |" in lines[3]
    assert "| torchao dynamic per-row | 48/48 | 1.05 [1.01-1.08] | - |" in lines[4]
    assert (
        lines[5] == "| vit_base_patch16_224 | torchao static per-tensor | refused | - | - | - | - |"
    )
    assert "- vit_base_patch16_224, torchao dynamic per-row: no ideal x (x)" in lines
    assert "- vit_base_patch16_224, torchao static per-tensor: refused: why" in lines
    assert PeersBench.model_validate_json(record.model_dump_json()) == record


def test_a_peer_failing_on_a_model_is_a_one_line_finding(monkeypatch):
    """torchao failing when it compiles or runs a model's engine is recorded as that config's
    refusal (with its error's first line); the row goes on with the other engines."""

    def fails(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no FP8 kernel for this shape\ntraceback of the library")

    engine = _Engine("fp8", nn.Identity())
    engine.module = fails
    monkeypatch.setattr(peers_run, "build_torchao", lambda *args: engine)
    prepared = SimpleNamespace(
        heldout_x=torch.rand(2, 3, 8, 8), config=SimpleNamespace(batches=(1,))
    )
    built, failure = peers_run._built_and_run(prepared, Peer.STATIC_TENSOR, ["a"])
    assert built is None and failure == "RuntimeError: no FP8 kernel for this shape"
    engine.module = nn.Identity()
    assert peers_run._built_and_run(prepared, Peer.STATIC_TENSOR, ["a"]) == (engine, None)


def test_our_engines_of_several_kernel_options_are_timed_side_by_side(
    tiny_imagenet, tmp_path, monkeypatch
):
    """`--ours` puts one engine per kernel option beside fp16 and torchao, each on the same
    fp16 rounds (on a GPU the default is the config's kernel and `fastest`; on a CPU the config's
    alone, since `fastest` times kernels on the GPU)."""
    _without_torchao(monkeypatch)
    out = tmp_path / "peers.json"
    assert _peers(tiny_imagenet, out, "--ours", "fused,scaled_mm", "test_efficientnet") == 0
    (row,) = read_record(out).results
    assert [e.name for e in row.engines] == ["fp16", "quantstudy fused", "quantstudy scaled_mm"]
    assert all(e.fp8_layers == 7 for e in row.engines[1:])
    report = render_folder(tmp_path)
    assert "| test_efficientnet | quantstudy scaled_mm | 7/7 |" in report


def test_an_unknown_kernel_option_for_ours_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "peers", "test_efficientnet", "--ours", "fused,bogus", "--out",
              str(tmp_path / "p.json")])  # fmt: skip
    assert stop.value.code == 2 and "--ours" in capsys.readouterr().err
