"""A study's engine from Python: `load_engine(study_dir)` rebuilds it as the study measured it.

Nothing here builds an engine: the study's model, plan and scales come from its record alone
(`bridge/rebuild.py`, as `quantstudy export` and `quantstudy package` rebuild them), and the
engine from the study's own table of builders (`study/engines.py: study_builders`) under the
study's build spec, its per-layer kernel choice replayed, not timed again (as `quantstudy
extend` rebuilds it). What cannot be rebuilt faithfully is refused in one line: a record of a
schema this quantstudy does not read, a study that stopped before its engines, a kernel choice
timed on another GPU, a batch the choice was not timed at, a GPU study where there is no GPU.

`EngineModule` wraps a built engine (`engines/builders.py: BuiltEngine`) as an `nn.Module`:
float32 NCHW images in, float32 logits out, on the engine's device, inference only.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from quantstudy.engines.base import Engine
from quantstudy.engines.builders import BuiltEngine
from quantstudy.env.machine import gpu_name
from quantstudy.record import EngineInfo, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.load import RECORD_FILE, load_record
from quantstudy.record.vocab import Engine as EngineName

ENGINES = (EngineName.FP8, EngineName.FP16, EngineName.FP32, EngineName.FAKEQUANT)
"""The engines `load_engine` rebuilds: the timed pair, the fp32 reference, the emulation."""


class EngineModule(nn.Module):
    """An engine as a module: `module(images)` maps float32 NCHW images, preprocessed as the
    model's timm config says, to float32 logits on the engine's device. Inference only (no
    autograd); it runs on the device it was built for. `info` says what it is: its real and
    emulated FP8 layers, their kernels (`info.layout`), dtype, compile mode.

    Example::

        engine = quantstudy.load_engine("studies/test_vit/generic_default-seed0-cpu")
        logits = engine(images)  # (N, 3, 160, 160) float32 -> (N, 1000)
    """

    def __init__(self, engine: Engine | BuiltEngine) -> None:
        super().__init__()
        assert isinstance(engine, BuiltEngine)  # what every study builder returns
        self.network = engine.eager  # registered: `state_dict`, `modules()` see the FP8 layers
        self.info: EngineInfo = engine.info()
        # not a submodule: its compiled module wraps `network`, which is registered above
        self.__dict__["_engine"] = engine

    @property
    def engine(self) -> BuiltEngine:
        """The built engine (`engines/builders.py`), as a study runs and times it."""
        built: BuiltEngine = self.__dict__["_engine"]
        return built

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype between layers (fp16 on CUDA, bf16 on the CPU; float32 for fp32)."""
        return self.engine.dtype

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        engine = self.engine
        with torch.no_grad():
            return engine.module(engine.prepare(images)).float()


def load_engine(
    study_dir: str | Path,
    engine: str = EngineName.FP8,
    *,
    batch: int | None = None,
    device: str | None = None,
    data: str | Path | None = None,
    calib_data: str | Path | None = None,
    weights: str | Path | None = None,
) -> EngineModule:
    """The engine `engine` ("fp8", "fp16", "fp32" or "fakequant") of the study in `study_dir`,
    rebuilt as the study measured it: its weights (checked by digest), recipe, recorded scales,
    build spec and kernel choice (module docstring).

    Example::

        fp8 = quantstudy.load_engine("studies/tf_efficientnet_lite0/generic_pointwise-seed0-cuda")
        top1 = fp8(images).argmax(1)

    `batch`: the batch the caller will run; an engine that chose its kernels per layer and batch
    (`--fp8-kernel fastest`) refuses one it did not time. `device`: default the study's; "cpu"
    rebuilds a GPU study's engine on the CPU (quality only: the fused layers' torch arithmetic).
    `data`, `calib_data`, `weights`: where the study's images or checkpoint are now, when moved
    (a random-weight study re-estimates BatchNorm on its calibration images, as it did)."""
    from quantstudy.bridge.rebuild import rebuild
    from quantstudy.study.engines import study_builders
    from quantstudy.study.prepare import study_device

    record = load_record(Path(study_dir) / RECORD_FILE, "load_engine")  # sealed: its scales
    name = _engine_name(engine)
    info = _recorded(record, name)
    fp8 = _recorded(record, EngineName.FP8)  # every engine but fp32 is built after its layout
    where = study_device(_device_name(record, info, device))
    _check_choice(record, fp8, where, batch)
    rebuilt = rebuild(record, _path(data), _path(calib_data), _path(weights))
    builders = study_builders(
        record.config,
        rebuilt.model,
        rebuilt.example,
        rebuilt.plan,
        rebuilt.fold_bn,
        where,
        record.build_spec(),
    )
    return EngineModule(builders[name](fp8.layout))


def _engine_name(engine: str) -> EngineName:
    if engine not in ENGINES:
        names = ", ".join(str(e) for e in ENGINES)
        raise UserError(f"engine {engine!r}: load_engine rebuilds one of {names}")
    return EngineName(engine)


def _recorded(record: StudyRecord, name: EngineName) -> EngineInfo:
    """The record's engine `name`; a study that stopped before building it is refused."""
    info = record.engine(name)
    fp8_layers = name != EngineName.FP8 or (
        info is not None and (info.fp8_real or info.fp8_emulated)
    )
    if info is None or not fp8_layers:
        raise UserError(
            f"study {record.name} has no {name} engine to load (status {record.status}); load "
            "the engine of a study that got past its engines"
        )
    return info


def _device_name(record: StudyRecord, info: EngineInfo, device: str | None) -> str:
    """The device to rebuild on: `device`, else the one the study built the engine on."""
    if device is not None:
        return device
    ran = info.device.split(":")[0]
    if ran == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"study {record.name} ran its {info.name} engine on a GPU and PyTorch sees no CUDA GPU "
            "here; load it on a GPU, or pass device='cpu' for its CPU emulation (quality only)"
        )
    return ran


def _check_choice(
    record: StudyRecord, fp8: EngineInfo, device: torch.device, batch: int | None
) -> None:
    """A kernel choice is replayed only where it was timed: on the same GPU, at a timed batch."""
    rows = fp8.layout.kernel_choice
    if not rows:
        return
    timed_on = record.environment.gpu_name
    timed = any(r.fused_us is not None or r.scaled_mm_us is not None for r in rows)
    here = gpu_name(device) or "the CPU"
    if timed and here != timed_on:
        raise UserError(
            f"study {record.name} chose each layer's FP8 kernel by timing it on {timed_on} "
            f"(--fp8-kernel fastest); here it would run on {here}, where that choice was not "
            f"timed: load it on {timed_on}, or run the study here"
        )
    batches = sorted({r.batch for r in rows if r.batch is not None})
    if batch is not None and batches and batch not in batches:
        raise UserError(
            f"study {record.name} chose its FP8 kernels per layer at batches "
            f"{', '.join(map(str, batches))} (--fp8-kernel fastest); batch {batch} was not "
            "timed: pass one of them, or batch=None to run each batch with the choice of the "
            "nearest timed one, as the study's quality pass did"
        )


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None
