"""Post-training quantization of a timm model, split by what each part does.

Subpackages, bottom to top (each imports only from those listed before it):
`formats` (number formats), `graph` (reading and editing a module graph), `kernels` (Triton
kernels), `layers` (FP8 modules), `backends` (the FP8 product backends by name),
`calibration` (activation scales), `rewrites` (graph changes around the FP8 layers),
`fitting` (weights and scales fitted to the fp32 model), `plan` (from a recipe's options to a
quantized model). docs/DESIGN.md explains why the stages are separate.
"""
