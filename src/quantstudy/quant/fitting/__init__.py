"""Fitting the stored FP8 weights, biases and scales to what the fp32 model computes: rounding,
bias correction, propagated fitting (the recipe's `propagated`), scale migration, end-to-end
tuning. Each changes stored numbers only, never the graph."""
