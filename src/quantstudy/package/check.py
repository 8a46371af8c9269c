"""`quantstudy package --check`: the packages run where quantstudy is not importable.

The packages' own script (`check.py` in the folder, `package/standalone.py` here) runs in a
fresh interpreter in isolated mode (`python -I`: no PYTHONPATH, no user site, not the script's
folder), with every import of quantstudy refused. It loads the FP8 package, runs the study's
held-out images (or the first `--images`) and times the FP8 package against the fp16 one. Here,
with quantstudy, the same images go through the study's FP8 engine rebuilt from the record, and
the two are compared as the export check compares (`bridge/check.py`): top-1 agreement and KL
at the reassociation floor (the fake-quant emulation against itself with only its summation
order changed, on the same images), plus a NaN/Inf count; the packaged x is printed beside
the study's x per batch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from quantstudy.bridge.check import CheckResult, check_numerics, compare, floor_of
from quantstudy.bridge.rebuild import eval_batch, load_set, rebuild
from quantstudy.engines.builders import build_fakequant
from quantstudy.engines.run import run_engine
from quantstudy.package import manifest as mf
from quantstudy.record.errors import UserError
from quantstudy.report.render import RECORD_FILE, load_record

# Within this share of the study's x the packaged engine keeps the speed the study reported.
X_TOLERANCE = 0.05


def run_script(folder: Path, *args: str, timeout: float = 3600) -> dict:
    """Run the folder's check script in an isolated interpreter; its JSON result. A binding
    mismatch or a crash is one clear line (a `UserError`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-I", str(folder / mf.CHECK_SCRIPT), str(folder), *args]
        done = subprocess.run(
            [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
            how = f"exit status {done.returncode}"
            if done.returncode < 0:
                how = f"killed by signal {-done.returncode}"
            raise UserError(f"the packages in {folder} did not run ({how}): {lines[-1]}")
        result = json.loads(out.read_text())
        result["stdout"] = done.stdout
        return result


def sample_outputs(folder: Path) -> dict:
    """The FP8 package's logits on the manifest's sample images, fingerprinted, computed by
    the folder's own script: the package loads and runs without quantstudy."""
    with tempfile.TemporaryDirectory() as tmp:
        logits_path = Path(tmp) / "logits.pt"
        result = run_script(folder, "--logits", str(logits_path))
        logits = torch.load(logits_path)
    return {
        "logits_sha256": mf.logits_sha256(logits),
        "top1": logits.argmax(dim=1).tolist(),
        "load_s": result["load_s"],
    }


@dataclass
class PackageCheck:
    result: CheckResult
    lines: list[str]


def _reference(folder: Path, manifest: dict, study_dir: Path, data, calib_data, images):
    """The check's images and the study's FP8 engine's logits on them, with the floor."""
    from quantstudy.package.build import build_engines

    record = load_record(Path(study_dir) / RECORD_FILE)
    if manifest["study"]["digest"] != record.digest:
        raise UserError(
            f"the packages in {folder} were built from another record than {study_dir}'s "
            f"(study digest {manifest['study']['digest']} vs {record.digest})"
        )
    x, _ = load_set(record, record.data.heldout, data)
    if images is not None:
        x = x[:images]
    rebuilt = rebuild(record, data, calib_data)
    device = torch.device(manifest["bound_to"]["device"])
    engines = build_engines(rebuilt, device)
    batch = eval_batch(record)
    with torch.no_grad():
        engine_logits = run_engine(engines.fp8.eagerly(), x, batch)
        fakequant = build_fakequant(
            rebuilt.model, torch.device("cpu"), rebuilt.example, rebuilt.plan,
            fold=rebuilt.fold_bn,
        )  # fmt: skip
        reference = run_engine(fakequant, x, batch)
        fakequant.channels_last = True
        fakequant.module = fakequant.module.to(memory_format=torch.channels_last)
        floor = floor_of(run_engine(fakequant, x, batch), reference)
    return record, x, engine_logits, floor


def check_package(
    folder: Path,
    study_dir: Path,
    data: Path | None = None,
    calib_data: Path | None = None,
    images: int | None = None,
) -> PackageCheck:
    """Run the packages without quantstudy and compare them with the study (module text)."""
    manifest_path = Path(folder) / mf.MANIFEST_FILE
    if not manifest_path.is_file():
        raise UserError(f"{folder} holds no {mf.MANIFEST_FILE}: not a `quantstudy package` folder")
    manifest = json.loads(manifest_path.read_text())
    record, x, engine_logits, floor = _reference(
        folder, manifest, study_dir, data, calib_data, images
    )
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(x, Path(tmp) / "images.pt")
        logits_path = Path(tmp) / "logits.pt"
        timing = ["--time"] if manifest["bound_to"]["device"] == "cuda" else []
        ran = run_script(
            folder, "--images", str(Path(tmp) / "images.pt"), "--logits", str(logits_path),
            *timing,
        )  # fmt: skip
        packaged = torch.load(logits_path)
    result = CheckResult()
    result.add(
        "without quantstudy",
        not ran["quantstudy_imported"],
        "the packages loaded and ran in `python -I` with quantstudy imports refused",
    )
    result.add(
        "NaN/Inf",
        ran["nonfinite"] == 0,
        f"{ran['nonfinite']} of {x.shape[0]} images with a non-finite logit",
    )
    check_numerics(
        compare(packaged, engine_logits), floor, record, result, "package vs FP8 engine",
        gated=True,
    )  # fmt: skip
    lines = [f"held-out images: {x.shape[0]}; load time (s): {ran['load_s']}"]
    lines += speed_lines(ran["timing"], manifest)
    return PackageCheck(result, lines)


def speed_lines(timing: dict, manifest: dict) -> list[str]:
    """The packaged x beside the study's x, per batch."""
    if not timing:
        return ["speed: not timed (CPU packages)"]
    study_x = manifest["study"]["study_x"]
    lines = ["batch  packaged fp16 ms  packaged FP8 ms  packaged x  study x"]
    for batch, t in timing.items():
        theirs = study_x.get(batch)
        shown = f"{theirs:.3f}" if theirs is not None else "-"
        lines.append(
            f"{batch:>5}  {t['fp16_ms']:>16.4f}  {t['fp8_ms']:>15.4f}  {t['x']:>10.3f}  {shown:>7}"
        )
    lines.append(f"timing: {next(iter(timing.values()))['method']}")
    return lines
