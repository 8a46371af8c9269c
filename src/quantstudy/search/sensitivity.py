"""Per-layer sensitivity: the fake-quant model with one candidate layer quantized at a time.

For each candidate layer of a plan, the fp32 emulation (BatchNorm folded as the recipe says,
quantize-dequantize at the same points as the FP8 engine) is run with only that layer quantized,
and optionally with every candidate quantized except that one. Each run is scored against the
unfolded fp32 reference on the same images with `quality.metrics.score_engine`: mean KL(fp32 ||
emulation) and top-1 agreement, non-finite rows handled as in the study.

One folded copy of the model is built once; layers are swapped for their quantize-dequantize
wrappers and back between runs, so a table of N layers costs N (or 2N + 1) forward passes over
the subset, not N model copies.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from quantstudy.engines.builders import deployed_copy
from quantstudy.quality.metrics import score_engine
from quantstudy.quant.graph.edit import replace_module
from quantstudy.quant.layers.matmul import QDQ
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.recipe.selectors import layer_kind
from quantstudy.record import EngineQuality, LayerSensitivity, Mode, SensitivitySection
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Engine

RANKED_BY = (
    "KL mean with only the layer quantized, largest first (a non-finite result ranks first); "
    "ties by lower agreement, then by name"
)


def kind_of(layer: nn.Module) -> str:
    """The layer's kind as the recipe counts it (conv2d.1x1, conv2d.depthwise, ..., linear)."""
    if isinstance(layer, nn.Conv2d):
        return layer_kind("conv2d", tuple(layer.kernel_size), layer.groups, layer.in_channels)
    if isinstance(layer, nn.Linear):
        return "linear"
    raise TypeError(f"{type(layer).__name__} is not a conv2d or linear layer")


def _logits(
    model: nn.Module, images: torch.Tensor, batch: int, device: torch.device
) -> torch.Tensor:
    with torch.no_grad():
        outs = [
            model(images[i : i + batch].to(device)).float().cpu()
            for i in range(0, images.shape[0], batch)
        ]
        return torch.cat(outs)


def _sort_key(row: EngineQuality, name: str) -> tuple[float, float, str]:
    kl = row.kl_mean if math.isfinite(row.kl_mean) else math.inf
    return (-kl, row.agreement, name)


def _ranked(
    layers: list[str],
    only: dict[str, EngineQuality],
    rest: dict[str, EngineQuality],
    originals: dict[str, nn.Module],
) -> list[LayerSensitivity]:
    """One row per layer, most sensitive first (`_sort_key`), with its all-but run if any."""
    order = sorted(layers, key=lambda n: _sort_key(only[n], n))
    rows = []
    for rank, name in enumerate(order, start=1):
        o, r = only[name], rest.get(name)
        rows.append(
            LayerSensitivity(
                layer=name,
                kind=kind_of(originals[name]),
                rank=rank,
                kl_mean=o.kl_mean,
                kl_max=o.kl_max,
                agreement=o.agreement,
                differ_count=o.differ_count,
                all_but_kl_mean=r.kl_mean if r else None,
                all_but_agreement=r.agreement if r else None,
                all_but_differ_count=r.differ_count if r else None,
            )
        )
    return rows


def _check(plan: QuantPlan, images: torch.Tensor, batch: int) -> None:
    """The user's inputs to a sensitivity run, refused in one line each."""
    if not plan.layers:
        raise UserError("sensitivity needs at least one candidate layer; the recipe selects none")
    if images.ndim != 4 or images.shape[0] < 1:
        raise UserError(
            f"sensitivity needs a non-empty NCHW image batch, got {tuple(images.shape)}"
        )
    if batch < 1:
        raise UserError(f"sensitivity batch must be positive, got {batch}")


def _quantized(
    model: nn.Module, example: torch.Tensor, fold: bool, plan: QuantPlan, device: torch.device
) -> dict[str, nn.Module]:
    """Each candidate layer as its FP8 emulation (QDQ): the quantized layers' float32 source,
    biases as every engine deploys them (corrected, or set by the propagated fit), and their FP8
    weights as every engine stores them."""
    source = deployed_copy(model, example, fold, plan)
    stored = plan.stored_weights(source)
    return {
        name: QDQ(
            source.get_submodule(name),
            FP8LayerSpec(
                plan.calibration.scale_of(name),
                plan.per_channel,
                torch.float32,
                weight=stored[name],
                **plan.input_quant(name, source.get_submodule(name)),
            ),
        ).to(device)
        for name in plan.layers
    }


def measure_sensitivity(
    model: nn.Module,
    example: torch.Tensor,
    plan: QuantPlan,
    images: torch.Tensor,
    *,
    fold: bool = True,
    all_but: bool = False,
    batch: int = 64,
    device: torch.device | str = "cpu",
    subset: str | None = None,
    ids_sha256: str | None = None,
) -> SensitivitySection:
    """Rank `plan.layers` by how much quantizing each one alone moves the output on `images`.

    `model` is the float32 model (not modified), `example` one input at the model's size (for
    BatchNorm folding), `images` float32 NCHW held-out images on the CPU. With `all_but`, each
    layer also gets the run with every other candidate quantized.
    """
    _check(plan, images, batch)
    device = torch.device(device)
    ref_model = copy.deepcopy(model).eval().to(device)
    ref = _logits(ref_model, images, batch, device)
    del ref_model

    work = deployed_copy(model, example, fold).to(device)
    originals = {name: work.get_submodule(name) for name in plan.layers}
    quantized = _quantized(model, example, fold, plan, device)

    def score(label: str) -> EngineQuality:
        return score_engine(label, ref, _logits(work, images, batch, device), None)

    only: dict[str, EngineQuality] = {}
    for name in plan.layers:
        replace_module(work, name, quantized[name])
        only[name] = score(f"only:{name}")
        replace_module(work, name, originals[name])

    for name in plan.layers:
        replace_module(work, name, quantized[name])
    every = score("all")
    rest: dict[str, EngineQuality] = {}
    if all_but:
        for name in plan.layers:
            replace_module(work, name, originals[name])
            rest[name] = score(f"all_but:{name}")
            replace_module(work, name, quantized[name])

    rows = _ranked(plan.layers, only, rest, originals)
    modes: list[Mode] = ["only", "all_but"] if all_but else ["only"]
    return SensitivitySection(
        reference=Engine.FP32,
        n_images=int(images.shape[0]),
        subset=subset or f"{images.shape[0]} images",
        ids_sha256=ids_sha256,
        modes=modes,
        ranked_by=RANKED_BY,
        all_kl_mean=every.kl_mean,
        all_agreement=every.agreement,
        layers=rows,
    )
