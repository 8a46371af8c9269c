"""`quantstudy package --check`: the packages run where quantstudy is not importable.

The packages' own script (`check.py` in the folder, `package/shipped_check.py` here) runs in a
fresh interpreter in isolated mode (`python -I`: no PYTHONPATH, no user site, not the script's
folder), with every import of quantstudy refused. It loads the FP8 package, runs the study's
held-out images (or the first `--images`) and times the FP8 package against the fp16 one. Here,
with quantstudy, the same images go through the study's FP8 engine rebuilt from the record, at
each package's batch (a static package of batch 1 against the engine at batch 1: kernels chosen
per batch, cuDNN's among them, may sum in other orders at other batches), and the two are
compared as the export check compares (`bridge/check.py`): top-1 agreement and KL at a floor,
plus a NaN/Inf count; the packaged x is printed beside the study's x per batch.

The floor is the study's half-storage floor on the check's images: the fake-quant emulation
with every stored value rounded to the engine's half dtype against the emulation in float32.
A package is the same arithmetic with Inductor choosing where the half-precision roundings
fall (a fused kernel keeps float32 between ops that the eager engine rounds), so it may move
as far from the engine as rounding the storage at all moves the emulation; the float32
reassociation floor of the export check would hold a half-precision engine to float32's
precision. On CUDA the reference is the engine compiled as the study compiled it, which is
Inductor's code as well and sits far below that floor.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from quantstudy.bridge.check import Agreement, CheckResult, Floor, check_numerics, compare, floor_of
from quantstudy.bridge.rebuild import eval_batch, load_set, rebuild
from quantstudy.engines.builders import build_fakequant
from quantstudy.engines.run import run_engine, run_half_storage
from quantstudy.package import manifest as mf
from quantstudy.package.loader import run_script
from quantstudy.record import StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.readers import read_json
from quantstudy.record.vocab import Engine

# Within this share of the study's x (or above it) the package keeps the speed the study reported.
X_TOLERANCE = 0.05


@dataclass
class PackageCheck:
    """What the check found: truthy when every finding passed."""

    result: CheckResult
    floor: Floor
    n_images: int
    timing: dict[str, Any]
    load_s: dict[str, Any]
    preloaded: str | None
    lines: list[str]
    per_package: dict[str, Agreement]

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def agreement(self) -> Agreement:
        """The FP8 package that agrees least with the study's engine (then the larger KL)."""
        return min(self.per_package.values(), key=lambda a: (a.agreement, -a.kl_mean))

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": bool(self.result),
            "findings": [asdict(f) for f in self.result.findings],
            "agreement": asdict(self.agreement),
            "per_package": {file: asdict(a) for file, a in self.per_package.items()},
            "floor": asdict(self.floor),
            "n_images": self.n_images,
            "timing": self.timing,
            "load_s": self.load_s,
            "LD_PRELOAD": self.preloaded,
        }


def _reference(
    folder: Path,
    manifest: dict[str, Any],
    study_dir: Path,
    data: Path | None,
    calib_data: Path | None,
    images: int | None,
) -> tuple[StudyRecord, torch.Tensor, dict[str, torch.Tensor], Floor]:
    """The check's images, the study's FP8 engine's logits on them for each FP8 package, by
    file, at the package's static batch or, for a package of dynamic batch, the study's eval
    batch (compiled where the study compiled it: a package is Inductor's code too), and the
    floor: the emulation with the engine's half-precision storage against the emulation in
    float32, on the same images."""
    from quantstudy.package.build import build_engines

    record = load_record(Path(study_dir) / RECORD_FILE)
    if manifest["study"]["digest"] != record.digest:
        raise UserError(
            f"the packages in {folder} were built from another record than {study_dir}'s "
            f"(study digest {manifest['study']['digest']} vs {record.digest})"
        )
    x, _ = load_set(Path(study_dir), record, record.data.heldout, data)
    if images is not None:
        x = x[:images]
    rebuilt = rebuild(record, data, calib_data)
    device = torch.device(manifest["bound_to"]["device"])
    engines = build_engines(rebuilt, device)
    batch_of = {f: b or eval_batch(record) for f, b in package_batches(manifest).items()}
    untimed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if device.type == "cuda":
        from quantstudy.quant.kernels.tuning import untimed_tiles

        untimed = untimed_tiles()  # the same bits under every tile (`study/run.py`)
    with torch.no_grad(), untimed:
        by_batch = {b: run_engine(engines.fp8, x, b) for b in sorted(set(batch_of.values()))}
    fakequant = build_fakequant(
        rebuilt.model, torch.device("cpu"), rebuilt.example, rebuilt.plan, fold=rebuilt.fold_bn
    )
    with torch.no_grad():  # the floor on the CPU, at the study's eval batch
        reference = run_engine(fakequant, x, eval_batch(record))
        half = run_half_storage(fakequant, x, engines.fp8.dtype, eval_batch(record))
    engine_logits = {file: by_batch[b] for file, b in batch_of.items()}
    return record, x, engine_logits, floor_of(half, reference)


def check_package(
    folder: Path,
    study_dir: Path,
    data: Path | None = None,
    calib_data: Path | None = None,
    images: int | None = None,
) -> PackageCheck:
    """Run the packages without quantstudy and compare them with the study (module text)."""
    manifest_path = Path(folder) / mf.MANIFEST_FILE
    if not manifest_path.exists():
        raise UserError(f"{folder} holds no {mf.MANIFEST_FILE}: not a `quantstudy package` folder")
    # a folder or a pipe in its place is refused unopened, in one line
    manifest = read_json(manifest_path, "package manifest", "record")
    record, x, engine_logits, floor = _reference(
        folder, manifest, study_dir, data, calib_data, images
    )
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(x, Path(tmp) / "images.pt")
        logits_path = Path(tmp) / "logits.pt"
        timing = ["--time"] if manifest["bound_to"]["device"] == "cuda" else []
        ran = run_script(
            folder, "--images", str(Path(tmp) / "images.pt"), "--each-logits", str(logits_path),
            *timing,
        )  # fmt: skip
        each = torch.load(logits_path)
    result = CheckResult()
    result.add(
        "without quantstudy",
        not ran["quantstudy_imported"],
        "the packages loaded and ran in `python -I` with quantstudy imports refused",
    )
    result.add(
        "NaN/Inf",
        ran["nonfinite"] == 0,
        f"{ran['nonfinite']} of {x.shape[0]} images with a non-finite logit in an FP8 package",
    )
    # every FP8 package is held to the floor: each is a deployable artifact, and a fault of one
    # batch's tiles (or of its graph) shows in that package alone
    per_package = {file: compare(logits, engine_logits[file]) for file, logits in each.items()}
    for file, found in per_package.items():
        check_numerics(found, floor, record, result, f"package vs FP8 engine ({file})", gated=True)
    lines = [f"held-out images: {x.shape[0]}; load time (s): {ran['load_s']}"]
    lines.append(f"loader: python -I, LD_PRELOAD={ran['preloaded'] or '(none)'}")
    lines += speed_lines(ran["timing"], manifest)
    return PackageCheck(
        result, floor, x.shape[0], ran["timing"], ran["load_s"], ran["preloaded"], lines,
        per_package,
    )  # fmt: skip


def package_batches(manifest: dict[str, Any]) -> dict[str, int | None]:
    """Each FP8 package's static batch, by file (None: a package of dynamic batch)."""
    return {e["file"]: e["batch"] for e in manifest["packages"] if e["engine"] == Engine.FP8}


def speed_lines(timing: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """The packaged x beside the study's x, per batch (reported, not gated: the two were timed
    in different processes, the study's possibly on another day)."""
    if not timing:
        return ["speed: not timed (CPU packages)"]
    study_x = manifest["study"]["study_x"]
    lines = ["batch  packaged fp16 ms  packaged FP8 ms  packaged x  study x  within 5%"]
    for batch, t in timing.items():
        theirs = study_x.get(batch)
        shown = f"{theirs:.3f}" if theirs is not None else "-"
        near = "-" if theirs is None else ("yes" if t["x"] >= theirs * (1 - X_TOLERANCE) else "no")
        lines.append(
            f"{batch:>5}  {t['fp16_ms']:>16.4f}  {t['fp8_ms']:>15.4f}  {t['x']:>10.3f}  "
            f"{shown:>7}  {near:>9}"
        )
    lines.append(f"timing: {next(iter(timing.values()))['method']}")
    return lines
