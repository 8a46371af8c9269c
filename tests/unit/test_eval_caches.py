"""Engines cast from a model that ran in eval mode compute timm's cached attention biases again
in their own dtype (`model/eval_caches.py`)."""

import timm
import torch

from quantstudy.engines.builders import build_fp8, build_half
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.resolve import resolve


def _cached(module: torch.nn.Module) -> list[torch.Tensor]:
    return [t for m in module.modules() for t in getattr(m, "attention_bias_cache", {}).values()]


def test_cast_engines_do_not_keep_the_float32_attention_bias_cache():
    """LeViT caches its attention biases at its first eval forward (calibration is one); the
    bf16 engines built after it must not hold the float32 copy (torch 2.11's CPU matmul then
    refuses float32 @ bfloat16 in the attention). Measured: with torch 2.11 (the GPU image's,
    `make test-image`, timm 1.0.29) this fails without `drop_eval_caches`; with torch 2.14 and
    timm 1.0.31 (the default venv) the cast itself
    leaves the cache empty, so it passes either way there."""
    torch.manual_seed(0)
    model = timm.create_model("levit_128s", num_classes=10).eval()
    x = torch.randn(2, 3, 224, 224)
    recipe, _ = load_recipe("generic_linears")
    layers = resolve(recipe, model, x[:1]).selected_names
    plan = build_plan(model, layers, lambda: [x], x[:1], quant_options(recipe))
    assert _cached(model) and all(t.dtype == torch.float32 for t in _cached(model))
    cpu = torch.device("cpu")
    for engine in (build_half(model, cpu, x[:1]), build_fp8(model, cpu, x[:1], plan)):
        with torch.no_grad():
            y = engine.eagerly().module(engine.prepare(x))
        assert y.dtype == torch.bfloat16
        cached = _cached(engine.eagerly().module)
        assert cached and all(t.dtype == torch.bfloat16 for t in cached)
