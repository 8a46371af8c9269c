"""Put a resolved recipe into a model: real FP8 layers for an engine, or the fp32 emulation."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from quantstudy.quant import backends
from quantstudy.quant.calibration.calibrate import Calibration
from quantstudy.quant.fitting.rounding import Search, compensable, fp8_weights
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.gelu import gelu_module
from quantstudy.quant.layers.matmul import QDQ, FP8Weight
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.rewrites.absorb import absorbable_activations
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import Activation, Epilogue, GeluForm, GeluPolicy

if TYPE_CHECKING:  # fitting/propagated.py builds on this module
    from quantstudy.quant.fitting.propagated import Fitted
    from quantstudy.quant.fitting.tune import Tuned


@dataclass(frozen=True)
class QuantPlan:
    """What to quantize and how: the selected layers, weight granularity, activation scales."""

    layers: list[str]
    per_channel: bool
    calibration: Calibration
    bias_correction: bool = False  # `quant/fitting/bias_correction.py`, from the recipe's weights
    rounding: str = "nearest"  # `quant/fitting/rounding.py`; compensating needs calibration moments
    row_scales: bool = False  # dynamic per-row activation scales instead of static per-tensor
    # layer -> per-input-channel divisor of its input (scale migration, `quant/fitting/migrate.py`)
    divisors: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    # with row_scales: only layers whose input has at most this many channels (None: all)
    row_max_channels: int | None = None
    # compensating rounding's scale candidates per channel and refinement sweeps
    scale_candidates: int = 1
    refine_sweeps: int = 0
    # weights and biases set by the propagated fit (`quant/fitting/propagated.py`), when asked
    fitted: Fitted | None = field(default=None, compare=False, repr=False)
    # what output tuning (`quant/fitting/tune.py`) measured; its values are in `fitted`
    tuned: Tuned | None = field(default=None, compare=False, repr=False)
    # the GELU forms the recipe allows an FP8 layer (`GeluPolicy`: erf only, or any a backend runs)
    gelu: GeluPolicy = GeluPolicy.ANY
    # stored weights by the bytes of the float weights they were rounded from (every engine of
    # a study rounds the same folded weights; compensating rounding takes seconds per layer)
    _stored: dict[str, dict[str, FP8Weight]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def weights_digest(self, source: nn.Module) -> str:
        """SHA-256 of the float32 weights of the plan's layers of `source`."""
        digest = hashlib.sha256()
        for name in self.layers:
            digest.update(source.get_submodule(name).weight.detach().float().cpu().numpy())
        return digest.hexdigest()

    def stored_weights(self, source: nn.Module) -> dict[str, FP8Weight]:
        """The FP8 weight and scale of every plan layer of the float32 `source` (BatchNorm folded
        where the recipe folds), as every engine stores it: migrated by the layer's divisor,
        then rounded the plan's way, or as the propagated fit set it
        (`quant/fitting/propagated.py`).
        Deterministic, so each engine computes the same values."""
        if self.fitted is not None:
            if self.weights_digest(source) != self.fitted.digest:
                raise ValueError("the plan's weights were fitted for another model")
            return self.fitted.weights
        migrated = source
        if self.divisors:
            migrated = copy.deepcopy(source)
            for name, d in self.divisors.items():
                w = migrated.get_submodule(name).weight
                with torch.no_grad():
                    w.mul_(d.reshape((1, -1) + (1,) * (w.dim() - 2)).to(w.dtype))
        moments = {
            name: m / torch.outer(self.divisors[name], self.divisors[name]).double()
            if name in self.divisors
            else m
            for name, m in self.calibration.second_moment.items()
        }
        key = self.weights_digest(migrated)
        if key not in self._stored:
            self._stored[key] = fp8_weights(
                migrated, self.layers, self.per_channel, self.rounding, moments, self.search
            )
        return self._stored[key]

    @property
    def search(self) -> Search:
        """Compensating rounding's searches (`quant/fitting/rounding.py`)."""
        return Search(self.scale_candidates, self.refine_sweeps)

    def static_input(self, name: str, layer: nn.Module) -> bool:
        """Whether `name` quantizes its input with its static per-tensor scale alone (what an
        FP8 hand-off from the layer before writes)."""
        return not self.per_row(layer) and name not in self.divisors

    def per_row(self, layer: nn.Module) -> bool:
        """Whether `layer` takes dynamic per-row input scales: the plan asks for them, the layer
        is a linear or dense 1x1 conv, and its input is no wider than `row_max_channels`."""
        if not (self.row_scales and compensable(layer)):
            return False
        width = layer.in_features if isinstance(layer, nn.Linear) else layer.in_channels
        return self.row_max_channels is None or width <= self.row_max_channels

    def input_quant(self, name: str, layer: nn.Module) -> dict[str, Any]:
        """How `layer` quantizes its input beyond the static scale: dynamic per-row scales and
        the migration divisor, for linears and dense 1x1 convs (others keep static scales)."""
        return {
            "row_scales": self.per_row(layer),
            "x_divisor": self.divisors.get(name) if compensable(layer) else None,
        }


@dataclass(frozen=True)
class Applied:
    """Which layers ended up real FP8 and which emulated (with the reason)."""

    real: list[str]
    emulated: list[tuple[str, str]]


def fp8_blocker(layer: nn.Module, kernel: str) -> str | None:
    """Why `layer` cannot run real FP8 with the backend `kernel`; None when it can
    (`quant/backends/`: what each backend runs, `Backend.blocker`)."""
    return backends.get(kernel).blocker(layer)


def real_layers(model: nn.Module, layers: list[str], kernel: str) -> list[str]:
    """The layers of `layers` that can run a real FP8 product with the backend `kernel`."""
    backend = backends.get(kernel)
    return [n for n in layers if backend.blocker(model.get_submodule(n)) is None]


def fp8_module(
    layer: nn.Module, spec: FP8LayerSpec, kernel: str, build: BuildSpec | None = None
) -> tuple[nn.Module, str | None]:
    """The module an FP8 engine puts in `layer`'s place, and why it is emulated (None: it runs a
    real FP8 product). The one place that chooses it: engines and per-layer timing alike.

    The backend `kernel` builds it (`Backend.build_layer`, in an engine of `build`, default
    `BuildSpec()` of that backend), with `spec.act` in the epilogue and, given
    `spec.out_scale`, writing the next layer's FP8 input where the backend takes them. A layer
    the backend cannot run (`Backend.blocker`) gets the quantize-dequantize `QDQ` in
    `spec.dtype`."""
    backend = backends.get(kernel)
    blocker = backend.blocker(layer)
    if blocker is not None:
        unfused = replace(spec, act=Activation.NONE, out_scale=None, fp8_input=False)
        return QDQ(layer, unfused), blocker
    return backend.build_layer(layer, spec, build or BuildSpec(kernel=kernel)), None


def apply_fp8(
    model: nn.Module,
    source: nn.Module,
    plan: QuantPlan,
    dtype: torch.dtype,
    kernel: str,
    epilogue: dict[str, str] | None = None,
    handoff: dict[str, str] | None = None,
    *,
    build: BuildSpec | None = None,
) -> Applied:
    """Swap the plan's layers of `model` (already in `dtype`) for FP8 modules built from `source`.

    `source` is the float32 model with the same structure (BatchNorm folded when the recipe folds),
    so weight scales come from full-precision weights, not from their fp16 copies. `kernel`
    "fused" builds `FusedFP8Matmul` layers with the activations of `epilogue` (layer -> name)
    in their epilogue; the caller has removed those activation modules from `model`. `handoff`
    (producer -> consumer, `quant/rewrites/handoff.py`) makes each producer write its consumer's FP8
    input and the consumer read it as is. `build`: the engine's build spec (default
    `BuildSpec()`); every FP8 product sums as its `promote` says (0: all of K in the tensor
    cores).
    """
    backend = backends.get(kernel)
    build = build or BuildSpec()
    epilogue = epilogue or {}
    handoff = handoff or {}
    if handoff and not backend.support.takes(Epilogue.FP8_OUTPUT):
        raise ValueError(f"FP8 hand-offs need a backend that writes FP8, not {kernel}")
    consumers = set(handoff.values())
    weights = plan.stored_weights(source)
    real: list[str] = []
    emulated: list[tuple[str, str]] = []
    for name in plan.layers:
        layer = source.get_submodule(name)
        nxt = handoff.get(name)
        spec = FP8LayerSpec(
            plan.calibration.scale_of(name),
            plan.per_channel,
            dtype,
            act=Activation(epilogue.get(name, Activation.NONE)),
            out_scale=plan.calibration.scale_of(nxt) if nxt is not None else None,
            fp8_input=name in consumers,
            weight=weights[name],
            promote=build.promote,
            gelu=plan.gelu,
            **plan.input_quant(name, layer),
        )
        new, blocker = fp8_module(layer, spec, kernel, build)
        replace_module(model, name, new)
        if blocker is None:
            real.append(name)
        else:
            emulated.append((name, blocker))
    return Applied(real, emulated)


def apply_fake_quant(
    model: nn.Module, plan: QuantPlan, weights: bool = True, activations: bool = True
) -> Applied:
    """Swap the plan's layers of the float32 `model` for quantize-dequantize emulations (the
    weights stored as the FP8 engine stores them, `QuantPlan.stored_weights`)."""
    stored = plan.stored_weights(model) if weights else {}
    for name in plan.layers:
        layer = model.get_submodule(name)
        x_scale = plan.calibration.scale_of(name) if activations else None
        spec = FP8LayerSpec(
            x_scale, plan.per_channel, torch.float32, weight=stored.get(name),
            **plan.input_quant(name, layer),
        )  # fmt: skip
        new = QDQ(layer, spec, quant_weights=weights)
        replace_module(model, name, new)
    return Applied([], [(n, "fake-quant emulation in fp32") for n in plan.layers])


def gelu_modules(model: nn.Module, layers: Iterable[str], example: torch.Tensor) -> dict[str, str]:
    """layer -> the GELU module that consumes its output in `model`, for each of `layers`,
    found as an engine finds the activation it absorbs (`quant/rewrites/absorb.py`). A layer
    without one is a bug here: its engine ran a GELU in its epilogue from the same model."""
    layers = sorted(layers)
    found = absorbable_activations(model, layers, example) if layers else {}
    for name in layers:
        if found.get(name, ("", Activation.NONE))[1] != Activation.GELU:
            raise ValueError(f"{name}: its engine ran GELU in its epilogue, but none follows it")
    return {name: found[name][0] for name in layers}


def emulate_tanh_gelu(model: nn.Module, layers: Iterable[str], example: torch.Tensor) -> None:
    """Make the GELU that consumes each of `layers` in the emulation `model` (in place) the tanh
    form: the layers whose FP8 engine computed tanh GELU in its epilogue (`FP8Layout.gelu`,
    cuBLASLt's)."""
    for act in gelu_modules(model, layers, example).values():
        replace_module(model, act, gelu_module(GeluForm.TANH))
