"""Activation calibration: the calibrators (max, percentile, MSE, entropy), the static
per-tensor scales they give over the calibration images, and the per-layer calibrator choice."""
