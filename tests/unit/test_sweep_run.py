"""Real sweeps on the CPU: three studies of a tiny random-weight model on a few generated images,
through the local executor and through Ray on a local cluster (127.0.0.1), a sweep stopped
mid-way and resumed, and a grid point whose recipe fails on its model (a family recipe naming
layers the model lacks) while the others finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from PIL import Image

from quantstudy.cli import main

pytestmark = pytest.mark.suite  # real sweeps of real studies: a minute each on 2 cores

SWEEP = """\
models:
  - {{name: test_efficientnet, weights: random}}
recipes: {recipes}
{calibrators}
data: data
calib: 4
heldout: 8
batches: [1, 2]
speed: false
device: cpu
"""
# What differs between two runs of one study: where and when it ran, how long it took, and the
# digest that seals those too.
UNMEASURED = ("environment", "timings", "digest")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A folder with 12 generated 48x48 images in 2 classes and two sweep files."""
    root = tmp_path_factory.mktemp("sweep")
    g = torch.Generator().manual_seed(0)
    for wnid in ("n01440764", "n01443537"):
        (root / "data" / wnid).mkdir(parents=True)
        for i in range(6):
            pixels = (torch.rand(48, 48, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / "data" / wnid / f"img{i}.jpg")
    three = SWEEP.format(
        recipes="[generic_pointwise]", calibrators="calibrators: [max, percentile, mse]"
    )
    (root / "three.yaml").write_text(three)
    # xception's family recipe names a stem that an EfficientNet lacks: it loads as the file is
    # read, and fails in its study (an unknown recipe is refused as the file is read)
    bad = SWEEP.format(recipes="[generic_pointwise, xception_pointwise]", calibrators="")
    (root / "bad.yaml").write_text(bad)
    return root


def _sigint(handling: signal.Handlers) -> Callable[[], object]:
    """A preexec_fn giving the child SIGINT's `handling`: SIG_DFL, so that the test does not
    depend on how pytest was started (a shell's background job inherits SIGINT ignored), or
    SIG_IGN, to start the sweep as such a job."""
    return lambda: signal.signal(signal.SIGINT, handling)


def _start_sweep(sweep_dir: Path, out: Path, handling: signal.Handlers) -> subprocess.Popen:
    """`quantstudy sweep bad.yaml` with one worker, started once its first study has cached
    its fp32 stress logits (the stop then lands mid-study)."""
    argv = [sys.executable, "-m", "quantstudy.cli", "sweep", str(sweep_dir / "bad.yaml")]
    proc = subprocess.Popen([*argv, "--out", str(out), "--workers", "1"], stderr=subprocess.PIPE,
                            preexec_fn=_sigint(handling))  # fmt: skip
    deadline = time.monotonic() + 600  # a guard against a hang, not a speed bound
    while not list(out.glob("*generic_pointwise*/.cache/stress-fp32-*.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "the first study never cached"
        time.sleep(0.1)
    return proc


def _sweep(sweep_dir: Path, name: str, out: str, *extra: str) -> int:
    return main(["sweep", str(sweep_dir / name), "--out", str(sweep_dir / out), *extra])


def _records(out: Path) -> dict[str, dict]:
    """Each point folder's study.json without the sections that say where and when it ran."""
    records = {}
    for path in sorted(out.glob("*/study.json")):
        record = json.loads(path.read_text())
        for key in UNMEASURED:
            record.pop(key, None)
        records[path.parent.name] = record
    return records


@pytest.fixture(scope="module")
def local_sweep(sweep_dir) -> Path:
    assert _sweep(sweep_dir, "three.yaml", "local", "--workers", "2") == 0
    return sweep_dir / "local"


def test_local_sweep_runs_every_point_as_a_study(local_sweep, capsys):
    summary = json.loads((local_sweep / "sweep.json").read_text())
    assert summary["counts"]["complete"] == 3
    assert [r["calibrator"] for r in summary["rows"]] == ["max", "percentile", "mse"]
    for row in summary["rows"]:
        folder = local_sweep / row["folder"]
        record = json.loads((folder / "study.json").read_text())
        assert record["status"] == "complete"
        assert record["calibration"]["calibrator"] == row["calibrator"]
        assert {s["stage"] for s in record["timings"]["stages"]} >= {"load", "calibrate", "score"}
        point = json.loads((folder / "point.json").read_text())
        assert point["status"] == "complete" and point["attempts"] == 1
        assert point["argv"][-2:] == ["--config", "study-config.json"]  # not flags rebuilt
        handed = json.loads((folder / "study-config.json").read_text())
        # the study records the sources it read and the accumulation its engines ran
        resolved = ("recipe", "policy", "fp8_accumulate")
        assert handed["fp8_accumulate"] is None and record["config"]["fp8_accumulate"] == "fast"
        assert {k: v for k, v in handed.items() if k not in resolved} == {
            k: v for k, v in record["config"].items() if k not in resolved
        }
        assert handed["out"] == "." and (folder / "run.log").is_file()
        assert row["agreement"] == next(
            e["agreement"] for e in record["quality"]["engines"] if e["engine"] == "fp8"
        )
    md = (local_sweep / "sweep.md").read_text()
    assert md.count("| test_efficientnet | generic_pointwise") == 3


def test_rerun_skips_finished_studies(sweep_dir, local_sweep, capsys):
    before = {p: p.stat().st_mtime_ns for p in local_sweep.glob("*/study.json")}
    assert _sweep(sweep_dir, "three.yaml", "local") == 0
    assert "3 finished before, 0 to run" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in local_sweep.glob("*/study.json")} == before


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for this module, bound to 127.0.0.1; the sweep reuses it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def test_ray_sweep_gives_the_local_records(sweep_dir, local_sweep, ray_cluster, capsys):
    # copy: each study runs in a temporary folder of its worker and comes back as bytes, the
    # path taken when workers do not share the driver's file system
    assert _sweep(sweep_dir, "three.yaml", "ray", "--executor", "ray", "--transfer", "copy") == 0
    assert "ray: 0 GPU(s), 2 CPU(s)" in (sweep_dir / "ray" / "sweep.md").read_text()
    local, remote = _records(local_sweep), _records(sweep_dir / "ray")
    assert list(local) == list(remote) and len(local) == 3
    for name in local:
        assert remote[name] == local[name], name
        assert (sweep_dir / "ray" / name / "report.md").is_file()


def test_stopped_sweep_resumes_and_a_bad_recipe_fails_alone(sweep_dir, capsys):
    out = sweep_dir / "resume"
    proc = _start_sweep(sweep_dir, out, signal.SIG_DFL)
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    (good,) = out.glob("*generic_pointwise*")
    assert json.loads((good / "point.json").read_text())["status"] == "interrupted"
    assert json.loads((out / "sweep.json").read_text())["counts"]["interrupted"] == 1

    assert _sweep(sweep_dir, "bad.yaml", "resume", "--workers", "2") == 1  # one point failed
    point = json.loads((good / "point.json").read_text())
    assert point["status"] == "complete" and point["attempts"] == 2
    assert "resumed stress-fp32" in (good / "run.log").read_text()
    (bad,) = out.glob("*xception_pointwise*")
    failed = json.loads((bad / "point.json").read_text())
    assert failed["status"] == "failed" and "'stem' matches no conv2d" in failed["error"]
    assert "xception_pointwise" in (bad / "run.log").read_text()
    md = (out / "sweep.md").read_text()
    assert "## Failed points" in md and failed["error"] in md


def test_a_sweep_started_with_sigint_ignored_still_stops_its_study_cleanly(sweep_dir):
    """A sweep run as a script's background job inherits SIGINT ignored and passes that on; its
    stop request to a study is SIGINT, which the study must still hear (`STOP_ON_SIGINT` in
    `sweep/point.py`) rather than be killed after the grace period with its record left
    unwritten."""
    from quantstudy.sweep.point import STOP_GRACE_S

    out = sweep_dir / "ignored"
    proc = _start_sweep(sweep_dir, out, signal.SIG_IGN)
    os.kill(proc.pid, signal.SIGTERM)  # what a background job is stopped with
    _, err = proc.communicate(timeout=60 + STOP_GRACE_S)
    assert proc.returncode == 130, err.decode()[-2000:]
    (good,) = out.glob("*generic_pointwise*")
    assert json.loads((good / "point.json").read_text())["status"] == "interrupted"
    # the study's own last words: it heard SIGINT and ended itself (one killed after the grace
    # period writes nothing more), whatever the time a loaded machine took to get there
    assert "interrupted; rerun the same command to resume" in (good / "run.log").read_text()
    assert json.loads((good / "study.json").read_text())["status"] == "partial"
