"""`run_study`: one study from model name to decision, in the order of the brief.

All user input is checked before any heavy work (model, folders, recipe). After each stage the
record is written atomically with status "partial"; engine outputs are cached under
`<out>/.cache`, keyed by everything that decides them, so an interrupted study resumes where it
stopped and a finished one re-renders without recomputing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.data.split import split_items, summarize_set
from quantstudy.decision.policy import decide, load_policy
from quantstudy.engines.base import Engine
from quantstudy.engines.builders import (
    COMPILE_MODES,
    build_fakequant,
    build_fp8,
    build_fp32,
    build_half,
    set_numerics,
)
from quantstudy.engines.run import run_engine
from quantstudy.errors import UserError
from quantstudy.model.batchnorm import reestimate_batchnorm
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quality.metrics import build_quality_section, emulation_gap, score_engine
from quantstudy.quality.nonfinite import scan_nonfinite
from quantstudy.quality.stress import stress_inputs
from quantstudy.quant.apply import QuantPlan
from quantstudy.quant.calibrate import calibrate
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.report.render import render_study
from quantstudy.speed.harness import measure_speed, speed_not_run
from quantstudy.study.config import StudyConfig
from quantstudy.study.environment import collect_environment
from quantstudy.study.io import write_json_atomic
from quantstudy.study.schema import DataInfo, StudyRecord

console = Console(stderr=True)

# Quality engines beyond the reference: name -> (fake-quant weights, fake-quant activations).
ATTRIBUTION = {
    "fakequant": (True, True),
    "fakequant_weights": (True, False),
    "fakequant_activations": (False, True),
}


@dataclass
class StageCache:
    """Tensors of finished stages, keyed by a hash of everything that decides them."""

    folder: Path
    key: str

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}-{self.key[:16]}.pt"

    def get_or_compute(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        path = self._path(name)
        if path.exists():
            console.print(f"[dim]resumed {name} from {path}[/dim]")
            return torch.load(path, weights_only=True)
        value = compute()
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(value, tmp)
        tmp.replace(path)
        return value


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda asked for, but PyTorch sees no CUDA GPU here. Run with --device cpu "
            "(quality only; timings are then marked not meaningful) or on a machine with a GPU"
        )
    return torch.device(name)


def _not_run(device: torch.device, random_weights: bool) -> list[str]:
    items = ["No TensorRT engine was built: TensorRT is not part of this study's engines."]
    if device.type != "cuda":
        items.append("GPU timings were not measured: the study ran on the CPU.")
    if random_weights:
        items.append("Accuracy was not measured meaningfully: the weights are random.")
    items += [
        "Per-layer sensitivity and the recipe search were not run in this study.",
        "Quantization-aware training was not tried.",
    ]
    return items


def run_study(config: StudyConfig) -> tuple[StudyRecord, Path]:
    """Run one study; returns the record and the path of its Markdown report."""
    set_numerics()
    device = _device(config.device)

    # --- inputs, all checked before heavy work ---------------------------------------------
    loaded = load_model(
        config.model, config.weights, seed=config.seed, strip_prefix=config.strip_prefix
    )
    model = loaded.model
    pre = resolve_preprocessing(model, test_settings=config.test_settings)
    scan = scan_folder(config.data, config.class_list)
    calib_scan = scan_folder(config.calib_data, config.class_list) if config.calib_data else None
    recipe_name = config.recipe or default_recipe_for(loaded.info.architecture)
    if config.recipe is None:
        console.print(f"recipe: [bold]{recipe_name}[/bold] (the family default)")
    recipe, recipe_source = load_recipe(recipe_name)
    example = torch.zeros(1, *pre.input_size)
    resolution = resolve(recipe, model, example)
    recipe_info = resolution.to_info(recipe, recipe_source)
    policy, policy_label = load_policy(config.policy)

    calib_items, heldout_items = split_items(
        scan.items,
        config.calib,
        config.heldout,
        seed=config.seed,
        calib_items=calib_scan.items if calib_scan else None,
    )
    labelled = scan.labelled
    data = DataInfo(
        data_dir=str(config.data),
        calib_dir=str(config.calib_data) if config.calib_data else None,
        class_list=str(scan.class_list) if scan.class_list else None,
        labelled=labelled,
        seed=config.seed,
        skipped=scan.skipped + (calib_scan.skipped if calib_scan else []),
        calibration=summarize_set(
            "calibration",
            str(config.calib_data or config.data),
            calib_items,
            calib_scan.labelled if calib_scan else labelled,
        ),
        heldout=summarize_set("heldout", str(config.data), heldout_items, labelled),
    )
    out_dir = config.out_dir(recipe.name)
    record = StudyRecord(
        name=config.study_name(recipe.name),
        status="partial",
        config=config.record(recipe_source),
        environment=collect_environment(device),
        model=loaded.info,
        preprocessing=pre,
        data=data,
        recipe=recipe_info,
        not_run=_not_run(device, loaded.info.random_weights),
    )
    _save(record, out_dir)

    key = hashlib.sha256(
        json.dumps(
            [
                record.config.model_dump(mode="json"),
                recipe_info.sha256,
                loaded.info.weights_sha256,
                data.calibration.ids_sha256,
                data.heldout.ids_sha256,
                pre.model_dump(mode="json"),
            ],
            sort_keys=True,
        ).encode()
    ).hexdigest()
    cache = StageCache(out_dir / ".cache", key)

    # --- calibration ------------------------------------------------------------------------
    transform = build_transform(pre)
    calib_x, _ = load_images(calib_items, transform, desc="calibration images")
    heldout_x, labels = load_images(heldout_items, transform, desc="held-out images")
    layers = [d.name for d in recipe_info.selected]
    ref_model = model.to(device)
    if loaded.info.random_weights:
        n_bn = reestimate_batchnorm(ref_model, _batches(calib_x, config.eval_batch, device))
        detail = (
            f"{loaded.info.weights_detail}; BatchNorm statistics of {n_bn} layers re-estimated "
            f"on the {calib_x.shape[0]} calibration images (keeps fp16 activations finite)"
        )
        record = record.model_copy(
            update={"model": record.model.model_copy(update={"weights_detail": detail})}
        )
    calibration = calibrate(
        ref_model,
        layers,
        _batches(calib_x, config.eval_batch, device),
        recipe.activations.calibrator,
        recipe.activations.params,
    )
    model = ref_model.cpu()
    plan = QuantPlan(layers, recipe.weights.granularity == "per_channel", calibration)
    record = record.model_copy(update={"calibration": calibration.info()})
    _save(record, out_dir)

    # --- engines and quality ----------------------------------------------------------------
    fold = recipe.weights.fold_bn
    stress = stress_inputs(pre)
    stress_x = torch.stack([t for _, t in stress])
    stress_names = [n for n, _ in stress]
    builders: dict[str, Callable[[], Engine]] = {
        "fp32": lambda: build_fp32(model, device),
        "fp16": lambda: build_half(
            model, device, example, fold=fold, compile_mode=config.compile_mode
        ),
        "fp8": lambda: build_fp8(
            model, device, example, plan, fold=fold, compile_mode=config.compile_mode
        ),
        **{
            name: (
                lambda w=w, a=a, name=name: build_fakequant(
                    model, device, example, plan, fold=fold, weights=w, activations=a, name=name
                )
            )
            for name, (w, a) in ATTRIBUTION.items()
        },
    }
    logits: dict[str, torch.Tensor] = {}
    stress_logits: dict[str, torch.Tensor] = {}
    infos = []
    engines: dict[str, Engine] = {}
    for name, build in builders.items():
        console.print(f"engine [bold]{name}[/bold]: building")
        engine = build()
        infos.append(engine.info())
        logits[name] = cache.get_or_compute(
            f"logits-{name}", lambda e=engine: run_engine(e, heldout_x, config.eval_batch)
        )
        stress_logits[name] = cache.get_or_compute(
            f"stress-{name}", lambda e=engine: run_engine(e, stress_x, config.eval_batch)
        )
        if name in ("fp16", "fp8"):
            engines[name] = engine
        if name == "fakequant":
            logits["fakequant_reordered"] = cache.get_or_compute(
                "logits-fakequant_reordered", lambda e=engine: _run_reordered(e, heldout_x, config)
            )
    record = record.model_copy(update={"engines": infos})
    _save(record, out_dir)

    ids = [item.id for item in heldout_items]
    scores = [
        score_engine(name, logits["fp32"], logits[name], labels, seed=config.seed)
        for name in builders
        if name != "fp32"
    ]
    scans = [
        scan_nonfinite(name, logits[name], ids, stress_logits[name], stress_names)
        for name in builders
    ]
    quality = build_quality_section(
        "fp32",
        scores,
        scans,
        stress_names,
        labels,
        emulation_gap(logits["fp8"], logits["fakequant"], logits["fakequant_reordered"]),
        loaded.info.random_weights,
    )
    record = record.model_copy(update={"quality": quality})
    _save(record, out_dir)

    # --- speed ------------------------------------------------------------------------------
    if config.speed:
        console.print("speed: timing fp16 and fp8 engines")
        speed = measure_speed(
            engines["fp16"],
            engines["fp8"],
            heldout_x,
            list(config.batches),
            compile_mode=COMPILE_MODES[config.compile_mode] or "default",
            package_dir=out_dir / "packages" if config.package else None,
        )
        record = record.model_copy(
            update={"speed": speed, "not_run": [*record.not_run, *speed_not_run(speed)]}
        )
    else:
        record = record.model_copy(
            update={"not_run": [*record.not_run, "Speed was not measured (--no-speed)."]}
        )

    # --- decision and report ----------------------------------------------------------------
    decision = decide(record, policy, policy_label)
    record = record.model_copy(update={"decision": decision, "status": "complete"})
    _save(record, out_dir)
    return record, render_study(out_dir)


def _batches(x: torch.Tensor, size: int, device: torch.device):
    return (x[i : i + size].to(device) for i in range(0, x.shape[0], size))


def _run_reordered(engine: Engine, images: torch.Tensor, config: StudyConfig) -> torch.Tensor:
    """The emulation again, channels-last: same arithmetic, fp32 sums in another order."""
    engine.channels_last = True
    engine.module = engine.module.to(memory_format=torch.channels_last)
    try:
        return run_engine(engine, images, config.eval_batch)
    finally:
        engine.channels_last = False


def _save(record: StudyRecord, out_dir: Path) -> None:
    write_json_atomic(out_dir / "study.json", record.model_dump(mode="json"))
