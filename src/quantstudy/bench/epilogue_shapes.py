"""The products the epilogue lab probe (`tools/lab/bench/epilogue.py`) times: the FP8 products
that end a residual block, where the epilogue's sum, activation and FP8 hand-off cost most
(docs/fp8-kernel.md, "The rewrites around the kernel"). Here, not in the probe, so the shapes are
checked on the CPU without loading a lab script."""

from __future__ import annotations

EPILOGUE_PROGRAM = "tools/lab/bench/epilogue.py"

# (name, M, N, K): res2net50_26w_4s at batch 128, each stage's conv3 (K = 4 x width, N = 4 x 64 x
# 2^stage channels, M = 128 x H x W)
SHAPES: tuple[tuple[str, int, int, int], ...] = (
    ("layer1 conv3", 128 * 56 * 56, 256, 104),
    ("layer2 conv3", 128 * 28 * 28, 512, 208),
    ("layer3 conv3", 128 * 14 * 14, 1024, 416),
    ("layer4 conv3", 128 * 7 * 7, 2048, 832),
)
