"""The engine interface: build once, then run batches; nothing touches the GPU at import.

An engine wraps a callable `module` that takes inputs already in the engine's own dtype, device and
memory format (`prepare` makes them). Splitting the two lets the timing harness capture exactly the
model call in a CUDA graph, with no cast or copy inside the timed region.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from quantstudy.record import EngineInfo


def in_memory_format(module: nn.Module, fmt: torch.memory_format) -> nn.Module:
    """`module` (in place) with its 4-D parameters and buffers in `fmt`: `module.to(memory_format=
    ...)` also converts 5-D ones, which channels-last (a 4-D format) refuses (timm's swin holds a
    5-D buffer), and a tensor of another rank has no such layout to take."""
    return module._apply(lambda t: t.contiguous(memory_format=fmt) if t.dim() == 4 else t)


class Engine(ABC):
    """A built engine: `engine(x)` maps float32 NCHW images to float32 logits on the CPU."""

    name: str
    device: torch.device
    dtype: torch.dtype
    channels_last: bool
    module: Callable[[torch.Tensor], torch.Tensor]

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Move a float32 NCHW batch into the engine's device, dtype and memory format."""
        x = x.to(self.device, self.dtype, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(self.prepare(x)).float().cpu()

    @abstractmethod
    def info(self) -> EngineInfo:
        """Describe the engine for the study record (layers, dtype, bytes, numerics)."""
