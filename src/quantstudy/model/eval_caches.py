"""Tensors timm modules derive from their parameters and cache while in eval mode.

LeViT, EfficientFormer and EfficientViT (among others) keep their attention biases per device in
`attention_bias_cache`, filled by the first eval forward (calibration, tracing) and emptied only
by `train()`. `Module.to(dtype)` does not convert them, so a copy cast to an engine's dtype after
such a forward keeps a float32 bias: the attention turns float32 and its next product mixes
dtypes (torch 2.11 refuses that on the CPU; seen with timm 1.0.29). Every copy cast to an
engine's dtype drops them.
"""

from __future__ import annotations

from torch import nn


def drop_eval_caches(model: nn.Module) -> nn.Module:
    """Empty every `attention_bias_cache` of `model`, which recomputes it in its own dtype."""
    for module in model.modules():
        cache = getattr(module, "attention_bias_cache", None)
        if isinstance(cache, dict):
            cache.clear()
    return model
