"""A torchao engine: the study's deployed model with torchao's float8 config on chosen layers.

The engine starts from the copy the fp16 engine starts from (`engines/builders.deployed_copy`:
BatchNorm folded as the recipe says), in the config's dtype, channels-last, on the device; then
`torchao.quantize_` with a filter that takes exactly the layers `configs.peer_layers` chose, and
the study's compile (`build_compiled`). The static config calibrates with torchao's own
observers (`step="prepare"`, the study's calibration images, `step="convert"`), as its users
would. Every config is made with `set_inductor_config=False`: torchao's recommended Inductor
settings are process-wide, and would change how the fp16 engine and ours compile too.

torchao is imported only here, and only when an engine is built or its version checked.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from quantstudy.bench.peers.configs import SPECS, Peer, torchao_refusal
from quantstudy.engines.builders import (
    BuiltEngine,
    build_compiled,
    count_float_layers,
    deployed_copy,
    half_dtype,
)
from quantstudy.env.machine import gpu_capability, torch_version
from quantstudy.model.eval_caches import drop_eval_caches
from quantstudy.quant.plan.apply import Applied
from quantstudy.record.vocab import Engine as EngineName
from quantstudy.study.prepare import Prepared, batches

CONV_CAPABILITY = (10, 0)  # torchao's FP8 conv: the mslk kernel, Blackwell and newer


def torchao_version() -> str | None:
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def torchao_status() -> str | None:
    """Why torchao cannot run here (absent, too old, beside too old a torch, or failing to
    import its float8 configs), in one line; None when it can."""
    version = torchao_version()
    refusal = torchao_refusal(version, torch_version())
    if refusal is not None:
        return refusal
    try:
        from torchao.quantization import (  # noqa: F401
            Float8DynamicActivationFloat8WeightConfig,
            Float8StaticActivationFloat8WeightConfig,
            PerRow,
            PerTensor,
            quantize_,
        )
    except ImportError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return (
            f"torchao {version} does not import its float8 configs with torch "
            f"{torch_version()}: {first}"
        )
    return None


def conv_fp8(device: torch.device) -> bool:
    """Whether torchao runs FP8 convs here: the mslk package, compute capability 10.0 on."""
    if device.type != "cuda" or importlib.util.find_spec("mslk") is None:
        return False
    return gpu_capability(device) >= CONV_CAPABILITY


def peer_dtype(peer: Peer, device: torch.device) -> torch.dtype:
    """The config's dtype on CUDA (`PeerSpec.dtype`); the study's half dtype elsewhere."""
    if device.type != "cuda":
        return half_dtype(device)
    return getattr(torch, SPECS[peer].dtype)


def _config(peer: Peer, **step: str) -> Any:
    from torchao import quantization as q

    spec = SPECS[peer]
    granularity = getattr(q, spec.granularity)()
    config = getattr(q, spec.config)
    return config(granularity=granularity, set_inductor_config=False, **step)


def config_text(peer: Peer) -> str:
    """How the engine was built, for the record."""
    spec = SPECS[peer]
    steps = " (step prepare, calibration images, step convert)" if spec.static else ""
    return (
        f"torchao.quantize_ with {spec.config}(granularity={spec.granularity}(), "
        f"set_inductor_config=False){steps} on the recipe's layers it takes"
    )


def build_torchao(prepared: Prepared, peer: Peer, layers: Sequence[str]) -> BuiltEngine:
    """The engine of `peer` on `layers` (module docstring); its `applied.real` lists the
    layers torchao really quantized (it may leave one as it is without saying so)."""
    device, config = prepared.device, prepared.config
    dtype = peer_dtype(peer, device)
    fold = prepared.recipe.weights.fold_bn
    m = drop_eval_caches(deployed_copy(prepared.model, prepared.example, fold).to(device, dtype))
    m = m.to(memory_format=torch.channels_last)
    calibration = (
        x.to(dtype).contiguous(memory_format=torch.channels_last)
        for x in batches(prepared.calib_x, config.eval_batch, device)
    )
    real = quantize_module(m, peer, layers, calibration)
    return build_compiled(
        EngineName.FP8, m, device, dtype, config.compile_mode,
        applied=Applied(real, []), float_layers=count_float_layers(m) - len(real),
    )  # fmt: skip


def quantize_module(
    m: torch.nn.Module, peer: Peer, layers: Sequence[str], calibration: Iterable[torch.Tensor]
) -> list[str]:
    """`torchao.quantize_` of `peer` on exactly the modules of `m` named in `layers`, in place;
    a static config first observes the `calibration` inputs (already in `m`'s dtype, device and
    layout). Returns the layers whose weight torchao really quantized."""
    from torchao.quantization import quantize_

    chosen = set(layers)

    def take(_module: torch.nn.Module, fqn: str) -> bool:
        return fqn in chosen

    if SPECS[peer].static:
        quantize_(m, _config(peer, step="prepare"), filter_fn=take)
        with torch.no_grad():
            for x in calibration:
                m(x)
        quantize_(m, _config(peer, step="convert"), filter_fn=take)
    else:
        quantize_(m, _config(peer), filter_fn=take)
    return quantized_layers(m, layers)


def quantized_layers(module: torch.nn.Module, layers: Sequence[str]) -> list[str]:
    """The `layers` of `module` whose weight torchao replaced by one of its tensor subclasses."""
    from torchao.utils import TorchAOBaseTensor

    return [n for n in layers if isinstance(module.get_submodule(n).weight, TorchAOBaseTensor)]
