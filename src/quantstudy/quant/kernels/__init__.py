"""Triton kernels for the FP8 layers: the fused matrix product, the k x k and depthwise
convolutions, their launchers, tile tables and tuning cache. Plain tensors in, tensors out: no
nn.Module here, so a kernel can be benchmarked and tested alone."""
