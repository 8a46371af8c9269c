"""Per-layer speed: fp16 against FP8 time of each candidate layer's own operation, on CUDA.

For each layer, two modules are timed against each other as the kernel choice times them
(`engines/layer_timing.py: time_layer`: CUDA graphs, ABBA-interleaved rounds, CUDA events):

- FP8: what the FP8 engine puts in the layer's place, from the same factory
  (`quant/plan/apply.py: fp8_module`): with the default `kernel` "fused", the fused layer (input
  quantize, one product with scale, bias and the activation it absorbs,
  `quant/rewrites/absorb.py`), with "scaled_mm" the unfused `FP8Matmul`, where a real FP8
  kernel exists; else the fp16 quantize-dequantize stand-in `QDQ` (path "emulated": it can
  only cost);
- fp16: the layer (BatchNorm folded, as in the fp16 engine) in fp16, channels-last, followed by
  the FP8 module's epilogue (`layer_timing.fp16_side`), so both sides compute the same thing.

Both run at the layer's real input shape (captured by a hook in one forward pass of the model,
batch dimension set to `batch`), on random normal inputs of that shape (values do not change
GEMM time; the activation scale is the calibrated one when given), compiled one layer at a time
with Inductor like the engines (`torch._dynamo.reset()` between layers, so every layer gets its
own compilation instead of hitting the recompile limit). The input quantize is inside the
timed call, so each layer pays its own quantize even where a deployed engine would share one
quantized tensor between two consumers.

The gains can also come from a JSON file (`load_layer_gains`), so the search can run where no
GPU is present; the record then says the gains were not measured by this study.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from quantstudy.engines import layer_timing
from quantstudy.engines.builders import allow_recompiles
from quantstudy.engines.layer_timing import fp16_side
from quantstudy.env.machine import gpu_name
from quantstudy.quant import backends
from quantstudy.quant.calibration.calibrate import Calibration
from quantstudy.quant.formats.fp8 import E4M3_MAX
from quantstudy.quant.graph.trace import input_shapes
from quantstudy.quant.layers.matmul import bind_scaled_mm
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import fp8_module, real_layers
from quantstudy.quant.rewrites.absorb import absorbable_activations
from quantstudy.quant.rewrites.fold import fold_batchnorm
from quantstudy.record import BatchSpeed, LayerSpeed, LayerSpeedSection
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file, read_json
from quantstudy.record.vocab import Activation, CompileMode, Engine, Epilogue, choices
from quantstudy.search.sensitivity import kind_of
from quantstudy.speed.stats import summarize_batch

NEEDS_CUDA = (
    "per-layer speed needs a CUDA GPU: PyTorch sees none here. Run `quantstudy search` on a "
    "machine with a GPU, or pass per-layer gains measured there with --gains FILE"
)


def layer_input_shapes(
    model: nn.Module, example: torch.Tensor, layers: list[str]
) -> dict[str, tuple[int, ...]]:
    """Shape of each layer's first positional input in one forward pass on `example`; every
    layer must run."""
    shapes = input_shapes(model, example, layers)
    missing = [n for n in layers if n not in shapes]
    if missing:
        raise UserError(f"layers never ran in a forward pass, so they have no shape: {missing[:5]}")
    return shapes


def need_cuda(device: torch.device) -> None:
    """Refuse a device other than a CUDA GPU: CPU timings of single layers are not evidence."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise UserError(NEEDS_CUDA)


def _timed_region(compile_mode: str, rounds: int, iters: int, warmup: int, kernel: str) -> str:
    return (
        "CUDA graph replay of one layer's operation (fp16: the BN-folded layer in fp16, followed "
        "by the activation the fused FP8 layer absorbs, if any; FP8: the FP8 engine's "
        f"replacement module with the '{kernel}' kernel, input quantize included), each compiled "
        "alone with "
        f"Inductor (compile mode '{compile_mode}'), on one device-resident random input of the "
        f"layer's real shape; {iters} replays between two CUDA events per round, {rounds} "
        f"rounds per module after warm-up ({warmup} replays), fp16 and FP8 rounds in ABBA order"
    )


def measure_layer_speed(
    model: nn.Module,
    example: torch.Tensor,
    layers: list[str],
    *,
    batch: int,
    per_channel: bool = True,
    calibration: Calibration | None = None,
    fold: bool = True,
    compile_mode: str = "default",
    rounds: int = 30,
    iters: int = 20,
    warmup: int = 10,
    device: torch.device | str = "cuda",
    spec: BuildSpec | None = None,
) -> LayerSpeedSection:
    """Time every layer of `layers` in fp16 and in FP8 at its real input shape with `batch`,
    each FP8 layer built as `spec` says (default `BuildSpec()`): its backend (for "fastest",
    the one the choice starts from) and how its products sum.

    Raises `UserError` without a CUDA GPU: CPU timings of single layers are not evidence.
    """
    device = torch.device(device)
    need_cuda(device)
    if batch < 1:
        raise UserError(f"per-layer speed batch must be positive, got {batch}")
    if compile_mode not in choices(CompileMode):
        raise UserError(f"compile mode must be one of {', '.join(choices(CompileMode))}")
    spec = spec or BuildSpec()
    fp8_kernel = spec.backend
    allow_recompiles()
    source = copy.deepcopy(model).eval()
    if fold:
        fold_batchnorm(source, example)
    shapes = layer_input_shapes(source, example, layers)
    real = real_layers(source, layers, fp8_kernel)
    fused = Epilogue.ACTIVATION in backends.get(fp8_kernel).support.epilogues
    absorbed = absorbable_activations(source, real, example) if fused else {}
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows: list[LayerSpeed] = []
    for name in layers:
        layer = source.get_submodule(name)
        shape = (batch, *shapes[name][1:])
        x = _random_input(shape, gen, device)
        if calibration is not None:
            scale = calibration.scale_of(name)
        else:
            scale = float(x.float().abs().amax()) / E4M3_MAX
        _, act = absorbed.get(name, (None, Activation.NONE))
        one = FP8LayerSpec(
            scale, per_channel, torch.float16, act=Activation(act), promote=spec.promote
        )
        fp8, blocker = fp8_module(layer, one, fp8_kernel, spec)
        f16, f8 = _compiled_pair(layer, fp8, device, compile_mode)
        # a random input of the layer's shape; the quantize counts: a layer chosen alone pays it
        t = layer_timing.time_layer(
            f16, {Engine.FP8: f8}, (x,), quantize_scale=None, rounds=rounds, iters=iters,
            warmup=warmup, device=device,
        )  # fmt: skip
        bs = summarize_batch(batch, t.ms(Engine.FP16), t.ms(Engine.FP8))
        rows.append(_row(name, layer, shape, bs, real=blocker is None))
    torch._dynamo.reset()
    return LayerSpeedSection(
        source="measured",
        source_detail=f"{device} ({gpu_name(device)})",
        meaningful=True,
        batch=batch,
        compile_mode=compile_mode,
        timed_region=_timed_region(compile_mode, rounds, iters, warmup, fp8_kernel),
        rounds=rounds,
        iters_per_round=iters,
        warmup=warmup,
        layers=rank_by_saving(rows),
    )


def _random_input(
    shape: tuple[int, ...], gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """A seeded fp16 random input of the layer's shape (channels-last for a conv's)."""
    x = torch.randn(shape, generator=gen).to(device, torch.float16)
    if x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _row(
    name: str, layer: nn.Module, shape: tuple[int, ...], bs: BatchSpeed, *, real: bool
) -> LayerSpeed:
    """One layer's row: its fp16 and FP8 times at `shape` (ranked later)."""
    return LayerSpeed(
        layer=name,
        kind=kind_of(layer),
        batch=shape[0],
        input_shape=list(shape),
        fp8_path="real" if real else "emulated",
        rank=0,
        saved_ms=bs.fp16_ms.median - bs.fp8_ms.median,
        fp16_ms=bs.fp16_ms,
        fp8_ms=bs.fp8_ms,
        ratio=bs.ratio,
        warnings=bs.warnings,
    )


def _compiled_pair(
    layer: nn.Module, fp8: nn.Module, device: torch.device, compile_mode: str
) -> tuple[nn.Module, nn.Module]:
    """`layer`'s fp16 side (`layer_timing.fp16_side`) and its FP8 module, each compiled alone
    as an engine would run it."""
    fp16 = fp16_side(layer, fp8, torch.float16, device)
    fp8 = fp8.to(device)
    bind_scaled_mm(fp8, device)
    for m in (fp16, fp8):
        m.eval().requires_grad_(False)
    torch._dynamo.reset()  # one compilation per layer; never the recompile limit's fallback
    mode = CompileMode(compile_mode).torch_mode
    f16 = torch.compile(fp16, mode=mode, dynamic=False)
    return f16, torch.compile(fp8, mode=mode, dynamic=False)


def rank_by_saving(rows: list[LayerSpeed]) -> list[LayerSpeed]:
    """Rows sorted by saving, largest first (ties by name), with their rank set."""
    ordered = sorted(rows, key=lambda r: (-r.saved_ms, r.layer))
    return [r.model_copy(update={"rank": i}) for i, r in enumerate(ordered, start=1)]


class _PlainGains(BaseModel):
    """The short gains file: `{"batch": 32, "saved_ms": {"layer.name": 0.012, ...}}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(ge=1)
    saved_ms: dict[str, float] = Field(min_length=1)


# The largest saving, either way, a gains file may give one layer: a single layer's own
# operation at any batch the tool times runs in milliseconds, so a figure of seconds is a unit
# or sign error (microseconds written as ms, -1e30), and it would decide the search alone.
MAX_SAVED_MS = 10_000.0


def load_layer_gains(path: Path) -> LayerSpeedSection:
    """Per-layer gains from a JSON file: a saved `LayerSpeedSection` (what a CUDA measurement
    writes) or the short form `{"batch": B, "saved_ms": {layer: ms}}`. Every number is finite
    (the reader refuses NaN and Infinity) and every saving within `MAX_SAVED_MS`."""
    path = Path(path)
    if not_a_file(path) == "missing":  # a pipe or a folder: refused by `read_json`, unopened
        raise UserError(f"gains file not found: {path}")
    data = read_json(path, "gains file")
    table = _gains_table(data, path)
    for row in table.layers:
        if abs(row.saved_ms) > MAX_SAVED_MS:
            raise UserError(
                f"gains file {path}: layer {row.layer} saves {row.saved_ms:g} ms; a layer's "
                f"saving is at most {MAX_SAVED_MS:g} ms either way: check the unit (ms) and sign"
            )
    return table


def _gains_table(data: object, path: Path) -> LayerSpeedSection:
    if isinstance(data, dict) and "layers" in data:
        try:
            table = LayerSpeedSection.model_validate(data)
        except ValidationError as err:
            raise UserError(
                f"gains file {path}: not a per-layer speed table ({_first(err)})"
            ) from None
        return table.model_copy(
            update={"source_detail": f"{table.source_detail}; read from {path}"}
        )
    try:
        plain = _PlainGains.model_validate(data)
    except ValidationError as err:
        raise UserError(
            f'gains file {path}: expected {{"batch": B, "saved_ms": {{layer: ms}}}} or a '
            f"per-layer speed table written by quantstudy ({_first(err)})"
        ) from None
    rows = [
        LayerSpeed(layer=name, batch=plain.batch, rank=0, saved_ms=ms)
        for name, ms in plain.saved_ms.items()
    ]
    return LayerSpeedSection(
        source="file",
        source_detail=str(path),
        meaningful=False,
        batch=plain.batch,
        layers=rank_by_saving(rows),
    )


def _first(err: ValidationError) -> str:
    """pydantic's first problem in one line: where, and what (its own text is many lines)."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"


def gains_for(section: LayerSpeedSection, layers: list[str]) -> dict[str, float]:
    """Saved ms per candidate layer; every candidate must have a figure."""
    by_name = {row.layer: row.saved_ms for row in section.layers}
    missing = [n for n in layers if n not in by_name]
    if missing:
        raise UserError(
            f"per-layer gains ({section.source_detail}) lack {len(missing)} candidate layer(s), "
            f"e.g. {', '.join(missing[:3])}; measure them, or give a file with every layer of "
            "the candidate recipe"
        )
    return {n: by_name[n] for n in layers}
