"""Graph rewrites around the FP8 layers: BatchNorm folding, activations and residual sums moved
into a layer's epilogue, and hand-offs where a layer writes the next one's FP8 (or padded)
input. Each keeps the float function and removes a pass."""
