"""The engine interface: build once, then run batches; nothing touches the GPU at import.

An engine wraps a callable `module` that takes inputs already in the engine's own dtype, device and
memory format (`prepare` makes them). Splitting the two lets the timing harness capture exactly the
model call in a CUDA graph, with no cast or copy inside the timed region.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from quantstudy.record import EngineInfo


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
