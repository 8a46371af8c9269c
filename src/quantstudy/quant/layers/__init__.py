"""FP8 layer modules that replace a float conv or linear: the real FP8 products (unfused and
fused with their epilogue), the quantize-dequantize emulation, and what they share (stored FP8
weights, output padding)."""
