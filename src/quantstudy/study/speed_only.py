"""A speed-only study (`--no-quality`): the fp16 and FP8 engines, compiled and timed, nothing else.

With random weights the quality passes measure an untrained network (no decision can rest on
them), and they are most of a study's time: the fp32 reference, three fake-quant emulations and
their held-out and stress passes. A speed-only study builds only the two timed engines; the
kernels' time does not depend on the weights' values, so its timings are as good as a full
study's. Each engine is compiled at every timed batch as a stage of its own (Inductor's
compilation and the FP8 kernels' tuning, both cached on disk by shape, `sweep/caches.py`), so
the record says what the compilation cost apart from the timing.
"""

from __future__ import annotations

import torch

from quantstudy.data.stream import Uint8Transform
from quantstudy.engines.base import Engine
from quantstudy.model.preprocess import EvalTransform
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import EngineInfo, FP8Layout, StudyConfig
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.speed.harness import MAX_INPUT_BUFFERS, tile_images
from quantstudy.study.cache import console
from quantstudy.study.engines import study_builders
from quantstudy.study.heldout import first_images
from quantstudy.study.inputs import StudyInputs
from quantstudy.study.stage_timer import StageTimer

TIMED = (EngineName.FP16, EngineName.FP8)
SPEED_ONLY_NOT_RUN = (
    "Quality was not measured (--no-quality, a speed-only study): no fp32 reference, no "
    "emulation and no held-out pass ran, so no quality gate can pass."
)


def timing_images(config: StudyConfig, inputs: StudyInputs) -> torch.Tensor:
    """The harness's inputs: the first held-out images (as many as its rotated input buffers
    can hold distinct), float32 on the host."""
    n = min(len(inputs.heldout_items), max(config.batches) * MAX_INPUT_BUFFERS)
    transform = Uint8Transform(EvalTransform(inputs.pre).steps)
    return first_images(inputs.heldout_items, transform, n, config.eval_batch)


def build_timed(
    config: StudyConfig,
    inputs: StudyInputs,
    plan: QuantPlan,
    images: torch.Tensor,
    device: torch.device,
    timer: StageTimer,
    spec: BuildSpec,
) -> tuple[dict[str, Engine], list[EngineInfo]]:
    """The fp16 and FP8 engines, each built, then called once at every timed batch (a compiled
    engine compiles, and the FP8 kernels tune, on the first call of each shape); the FP8
    engine's as `spec` says."""
    fold = inputs.recipe.weights.fold_bn
    builders = study_builders(config, inputs.loaded.model, inputs.example, plan, fold, device, spec)
    timed: dict[str, Engine] = {}
    infos = []
    for name in TIMED:
        console.print(f"engine [bold]{name}[/bold]: building")
        with timer.stage(f"engine {name}: build"):
            engine = builders[name](FP8Layout())  # no emulation here takes its layout
        infos.append(engine.info())
        for batch in config.batches:
            with timer.stage(f"engine {name}: compile at batch {batch}"):
                _first_call(engine, tile_images(images, batch), device)
        timed[name] = engine
    return timed, infos


def _first_call(engine: Engine, x: torch.Tensor, device: torch.device) -> None:
    """One call of `engine` on `x`, finished before returning."""
    with torch.no_grad():
        engine.module(engine.prepare(x))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
