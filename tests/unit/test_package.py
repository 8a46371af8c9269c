"""`quantstudy package`: the FP8 ops as packaged ops, the launch record, the refusals, and
(slow) a whole CPU package of a small study checked in a process without quantstudy."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.torch_version import TorchVersion

from quantstudy.cli import main
from quantstudy.package import build
from quantstudy.package.graph import export_engine, retarget
from quantstudy.package.manifest import MANIFEST_FILE
from quantstudy.package.ops import NAMESPACE, PACKAGED, STUDY_OPS
from quantstudy.quant.formats.fp8 import quantize_weight, to_fp8
from quantstudy.quant.kernels import launches
from quantstudy.quant.layers.fused_matmul import fp8_gemm
from quantstudy.record.errors import UserError
from quantstudy.record.load import load_record
from quantstudy.study.per_image import set_ids
from tests.unit._package_study import package_study

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SHIPPED_CHECK = Path(build.__file__).with_name("shipped_check.py")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return package_study(tmp_path_factory.mktemp("package"))


class Pointwise(nn.Module):
    """One fused FP8 product (the study op), as an engine calls it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        w8, w_scale = quantize_weight(torch.randn(24, 32), per_channel=True)
        self.register_buffer("w8", w8)
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("x_scale", torch.tensor(0.02))
        self.register_buffer("bias", torch.randn(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = to_fp8(x, self.x_scale)
        return fp8_gemm(xq, self.w8, self.w_scale, self.x_scale, self.bias, "relu",
                        torch.bfloat16, None, torch.bfloat16)  # fmt: skip


def test_retarget_leaves_no_quantstudy_op_and_computes_the_same_bits():
    m = Pointwise().eval()
    x = torch.randn(10, 32)
    program = export_engine(m, x, None)
    assert retarget(program) == {"fp8_gemm": 1}
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if t.startswith("quantstudy.")]
    assert "quantstudy_pkg.fp8_gemm.default" in targets
    # the twin's CPU body is the study op's own arithmetic: equal bits, not a tolerance
    assert torch.equal(program.module()(x), m(x))


class Net(nn.Module):
    """A dense 3x3 conv, 1x1 convs around a depthwise conv, a linear: every FP8 op kind."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.pw1 = nn.Conv2d(32, 64, 1)
        self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.pw2 = nn.Conv2d(64, 32, 1)
        self.conv = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.dw(torch.relu(self.pw1(x))))
        x = torch.relu(self.conv(torch.relu(self.pw2(x))))
        return self.fc(x.mean((2, 3)))


def test_every_op_twin_computes_the_study_engines_bits():
    from quantstudy.engines.builders import build_fp8
    from quantstudy.quant.calibration.calibrate import calibrate
    from quantstudy.quant.plan.apply import QuantPlan

    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(4, 3, 16, 16)
    layers = ["pw1", "dw", "pw2", "conv", "fc"]
    plan = QuantPlan(layers, True, calibrate(m, layers, [x]))
    engine = build_fp8(m, torch.device("cpu"), x[:1], plan)
    prepared = engine.prepare(x)
    program = export_engine(engine.eager, prepared, None)
    counts = retarget(program)
    assert {"fp8_depthwise", "fp8_conv2d"} <= set(counts), counts
    assert sum(counts.values()) == len(layers), counts
    with torch.no_grad():
        assert torch.equal(program.module()(prepared), engine.eager(prepared))
    # a dynamic batch (`--dynamic-batch 1:8`): one program for every batch in the range
    dynamic = export_engine(engine.eager, prepared, (1, 8))
    assert retarget(dynamic) == counts
    for b in (1, 3):
        xb = engine.prepare(torch.randn(b, 3, 16, 16))
        with torch.no_grad():
            assert torch.equal(dynamic.module()(xb), engine.eager(xb))
    # `--dynamic-batch 1:4` of a study timed at 1: exported at 2, since at 1 torch.export makes
    # the batch a constant and refuses the range (an internal error, before `export_batch`)
    assert build.export_batch(None, [1]) == 2 and build.export_batch(8, [8]) == 8
    export_engine(engine.eager, engine.prepare(x[: build.export_batch(None, [1])]), (1, 4))


def test_launch_record_serves_static_and_symbolic_keys():
    record = launches.LaunchRecord()
    options = {"ACT": 0, "HAS_BIAS": True}
    dtypes = [torch.empty(0, dtype=torch.float8_e4m3fn)] * 2

    def key(m: int) -> launches.LaunchKey:
        return launches.launch_key("fp8_gemm", {"M": m, "N": 24, "K": 32}, options, dtypes)

    blocks = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    record.add(key(8), launches.Tile(blocks))
    record.add(key(128), launches.Tile(blocks | {"BLOCK_M": 128}, 2, True))
    assert record.lookup(key(8)).sizes("BLOCK_M", "num_warps") == (64, 4)
    assert record.tma_replaced == 1
    # a dynamic batch: the symbolic size matches both; the largest recorded launch wins
    symbolic = (key(8)[0], (("M", None), *key(8)[1][1:]), *key(8)[2:])
    assert record.lookup(symbolic).stream == 2
    with pytest.raises(RuntimeError, match="no tile was recorded"):
        record.lookup(key(16))
    with pytest.raises(RuntimeError, match="no tile was recorded"):
        record.lookup(launches.launch_key("fp8_gemm", {"M": 8}, options, dtypes))
    rows = record.rows()
    assert rows[1] == {
        "launcher": "fp8_gemm",
        "sizes": {"M": 128, "N": 24, "K": 32},
        "blocks": blocks | {"BLOCK_M": 128},
        "stream": 2,
        "tma_replaced": True,
    }
    # a caller's tile without warps and stages runs with Triton's defaults
    given = launches.Tile.given(("BLOCK_P", "BLOCK_C"), (64, 32))
    assert given.sizes("BLOCK_P", "BLOCK_C", "num_warps", "num_stages") == (64, 32, 4, 3)


def test_packaged_ops_have_the_study_ops_schemas():
    """`graph.retarget` swaps a node's target and keeps its arguments: each packaged op must
    take exactly what its study op takes (both are registered from one function)."""
    for op in STUDY_OPS:
        study = getattr(torch.ops.quantstudy, op.name).default._schema
        packaged = getattr(torch.ops.quantstudy_pkg, op.name).default._schema
        assert str(packaged).removeprefix("quantstudy_pkg::") == str(study).removeprefix(
            "quantstudy::"
        )
        assert PACKAGED[op.name] is op.packaged(NAMESPACE)


def _edited(study: Path, tmp_path: Path, edit) -> Path:
    """A copy of the study whose record is edited (and so unsealed: no digest)."""
    copy = tmp_path / "edited"
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns(".cache", "package*"))
    data = json.loads((copy / "study.json").read_text())
    data.pop("digest", None)
    edit(data)
    (copy / "study.json").write_text(json.dumps(data))
    return copy


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one clean line, no traceback
    return err[0]


def test_a_cpu_study_has_no_gpu_engine_to_package(study, capsys):
    assert main(["package", str(study)]) == 1
    assert "ran its FP8 engine on cpu" in _error(capsys)
    assert not (study / "package").exists()


def test_a_study_without_fp8_engine_is_refused(study, tmp_path, capsys):
    def drop(data):
        data["engines"] = [e for e in data["engines"] if e["name"] != "fp8"]

    edited = _edited(study, tmp_path, drop)
    assert main(["package", str(edited), "--device", "cpu"]) == 1
    assert "has no FP8 engine to package" in _error(capsys)
    assert not (edited / "package").exists()


@pytest.fixture
def any_torch(monkeypatch):
    """Lift the CPU package's torch floor: these refusals come before any compile, on every
    torch (the floor's own refusal is test_an_older_torch_refuses_a_cpu_package)."""
    monkeypatch.setattr(build, "CPU_PACKAGE_TORCH", (0, 0))


def test_moved_and_changed_weights_are_refused(study, tmp_path, capsys, any_torch):
    weights = Path(load_record(study / "study.json").config.weights)
    moved = weights.with_suffix(".moved")
    weights.rename(moved)
    try:
        assert main(["package", str(study), "--device", "cpu"]) == 1
        assert str(weights) in _error(capsys)
    finally:
        moved.rename(weights)
    original = weights.read_bytes()
    try:
        state = torch.load(weights)
        state[next(iter(state))] += 1.0
        torch.save(state, weights)
        assert main(["package", str(study), "--device", "cpu"]) == 1
        assert "export from the same checkpoint" in _error(capsys)
    finally:
        weights.write_bytes(original)
    assert not (study / "package").exists()


def test_an_existing_out_folder_is_refused_untouched(study, tmp_path, capsys, any_torch):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["package", str(study), "--device", "cpu", "--out", str(out)]) == 1
    assert "exists; choose another --out" in _error(capsys)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_a_gpu_without_fp8_is_refused(study, monkeypatch):
    record = load_record(study / "study.json")
    engines = [e.model_copy(update={"device": "cuda:0"}) for e in record.engines]
    record = record.model_copy(update={"engines": engines})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    with pytest.raises(UserError, match=r"A100 \(compute capability 8.0\) has no FP8"):
        build.check_device(record, "cuda")


def _standalone(folder: Path, *args: str) -> subprocess.CompletedProcess:
    shutil.copy(SHIPPED_CHECK, folder / "check.py")
    cmd = [sys.executable, "-I", str(folder / "check.py"), str(folder), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_standalone_refuses_another_torch_in_one_line(tmp_path):
    manifest = {"bound_to": {"device": "cpu", "torch": "0.0.1"}, "packages": []}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    done = _standalone(tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"package check: error: the packages were built for torch 0.0.1, this machine has "
        f"{torch.__version__}; rebuild them here with `quantstudy package`"
    ]


@pytest.mark.parametrize("kind", ["missing", "pipe", "folder", "not json"])
def test_standalone_refuses_a_manifest_it_cannot_read_in_one_line(tmp_path, kind):
    """The shipped check reads manifest.json without quantstudy's readers: a pipe in its place
    is refused unopened (it would block), as are a folder, no file and a file that is not JSON."""
    manifest = tmp_path / MANIFEST_FILE
    if kind == "pipe":
        os.mkfifo(manifest)
    elif kind == "folder":
        manifest.mkdir()
    elif kind == "not json":
        manifest.write_text("{not json")
    done = _standalone(tmp_path)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("package check: error: ") and str(manifest) in line
    said = {"missing": "No such file", "pipe": "is not a file", "folder": "is not a file"}
    assert said.get(kind, "is not valid JSON") in line


def test_an_older_torch_refuses_a_cpu_package(study, monkeypatch):
    record = load_record(study / "study.json")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cpu")
    with pytest.raises(UserError) as refused:
        build.check_device(record, "cpu")
    assert str(refused.value) == (
        "packaging the CPU emulation needs torch 2.14 or later (torch 2.11.0+cpu's AOTInductor "
        "writes a CPU wrapper that cannot name float8 types); package on a GPU, or upgrade torch"
    )


@pytest.fixture(scope="module")
def cpu_package(study, tmp_path_factory) -> tuple[Path, str]:
    """The study packaged for the CPU at batch 2 and checked: (folder, what it printed)."""
    if TorchVersion(torch.__version__) < build.CPU_PACKAGE_TORCH:
        pytest.skip(
            f"torch {torch.__version__} cannot package the CPU emulation (older than "
            "build.CPU_PACKAGE_TORCH); test_an_older_torch_refuses_a_cpu_package checks the line"
        )
    out = tmp_path_factory.mktemp("cpu_package") / "pkg"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["package", str(study), "--device", "cpu", "--batches", "2", "--out",
                       str(out), "--check"])  # fmt: skip
    assert status == 0, printed.getvalue()
    return out, printed.getvalue()


@pytest.mark.slow  # two AOTInductor CPU compiles and a check: minutes on a 2-core CPU
def test_cpu_package_runs_without_quantstudy_and_agrees(study, cpu_package, capsys):
    out, printed = cpu_package
    assert "[pass] without quantstudy" in printed and "check passed" in printed
    assert "[pass] package vs FP8 engine" in printed
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    record = load_record(study / "study.json")
    assert manifest["study"]["digest"] == record.digest
    assert manifest["study"]["weights_sha256"] == record.model.weights_sha256
    assert manifest["study"]["fp8_layers"] == [d.name for d in record.recipe.selected]
    assert manifest["preprocessing"]["input_size"] == [3, 160, 160]
    assert manifest["input"] | {"what": ""} == {
        "shape": ["batch", 3, 160, 160], "dtype": "bfloat16", "memory_format": "channels_last",
        "what": "",
    }  # fmt: skip
    assert manifest["bound_to"] == {"device": "cpu", "torch": torch.__version__}
    assert manifest["fp8_ops"] == {"fp8_gemm": len(record.recipe.selected)}
    files = sorted(p.name for p in out.iterdir())
    assert files == ["check.py", "fp16-b2.pt2", "fp8-b2.pt2", "manifest.json", "sample_images.pt"]
    assert not list(out.parent.glob(".pkg.partial-*"))
    sample = manifest["sample"]
    held = set_ids(study, record, record.data.heldout)
    assert sample["ids"] == held[:4] and len(sample["top1"]) == 4
    # the fingerprint is reproduced by loading the package again, here, with torch alone
    from torch._inductor import aoti_load_package

    images = torch.load(out / "sample_images.pt")
    x = images.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    model = aoti_load_package(str(out / "fp8-b2.pt2"))
    with torch.no_grad():
        logits = torch.cat([model(x[i : i + 2]).float() for i in range(0, 4, 2)])
    from quantstudy.package.manifest import logits_sha256

    assert logits_sha256(logits) == sample["logits_sha256"]
    # the folder's own script times the pair with torch alone (host clock on a CPU)
    timed = subprocess.run(
        [sys.executable, "-I", str(out / "check.py"), str(out), "--time", "--rounds", "2",
         "--iters", "1", "--out", str(out.parent / "timed.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert timed.returncode == 0, timed.stderr[-3000:]
    result = json.loads((out.parent / "timed.json").read_text())
    assert result["timing"]["2"]["method"] == "host clock" and result["timing"]["2"]["x"] > 0
    assert not result["quantstudy_imported"]
    # a package folder that exists is checked again, not rebuilt; an edited binding fails
    (out / MANIFEST_FILE).write_text(
        json.dumps(manifest | {"bound_to": {"device": "cpu", "torch": "0.0.1"}})
    )
    assert main(["package", str(study), "--device", "cpu", "--out", str(out), "--check"]) == 1
    assert "built for torch 0.0.1" in _error(capsys)


@pytest.mark.slow  # builds the C++ example against the wheel's libtorch: minutes on 2 cores
def test_cpp_loader_example_matches_python(cpu_package, tmp_path):
    out, _ = cpu_package
    binary = tmp_path / "run_package"
    build = Path(__file__).resolve().parents[2] / "examples" / "package-cpp" / "build.sh"
    if not build.is_file():
        pytest.skip("examples/package-cpp is not in this copy (an installed package)")
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run([str(build), str(binary)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    package = out / "fp8-b2.pt2"
    ran = subprocess.run(
        [str(binary), str(package), "cpu", "bfloat16", "2", "3", "160", "160", "0.5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "output [2, 1000]" in ran.stdout
    cpp_top1 = [int(line.split()[1]) for line in ran.stdout.splitlines() if line.startswith("top1")]
    from torch._inductor import aoti_load_package

    x = torch.full((2, 3, 160, 160), 0.5, dtype=torch.bfloat16)
    with torch.no_grad():
        logits = aoti_load_package(str(package))(x.contiguous(memory_format=torch.channels_last))
    assert cpp_top1 == logits.float().argmax(1).tolist()


def test_each_fp8_package_is_checked_at_its_own_batch():
    """`verify.package_batches`: the static FP8 packages' batches, by file, at which the check
    runs the study's engine for each (None: a dynamic package, checked at the eval batch)."""
    from quantstudy.package.verify import package_batches

    manifest = {
        "packages": [
            {"file": "fp8-b1.pt2", "engine": "fp8", "batch": 1},
            {"file": "fp16-b1.pt2", "engine": "fp16", "batch": 1},
            {"file": "fp8-b128.pt2", "engine": "fp8", "batch": 128},
            {"file": "fp8-dyn.pt2", "engine": "fp8", "batch": None, "max_batch": 64},
        ]
    }
    assert package_batches(manifest) == {"fp8-b1.pt2": 1, "fp8-b128.pt2": 128, "fp8-dyn.pt2": None}
