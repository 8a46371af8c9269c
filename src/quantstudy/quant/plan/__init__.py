"""From a recipe's quantization options to a quantized model: the plan (scales, fitted weights)
built once from the calibration images, and its application as real FP8 layers or as the fp32
emulation."""
