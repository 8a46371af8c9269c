"""cuBLASLt's FP8 matrix product with its own epilogues (bias, GELU, the residual as C, an FP8
output scaled for the next layer), reached through ctypes from the libcublasLt that torch's CUDA
wheels already load: no binding package, nothing compiled, and the same library torch's own
`torch._scaled_mm` runs (docs/cublaslt.md says why this binding and not nvmath-python's).

`abi` holds the header's numbers, `problem` the pure part (operand layouts, the epilogue a layer
asks for, what alignment cuBLASLt needs), `library` finds and loads the library or says in one
line why it cannot, `matmul` builds one product's descriptors once and launches it.
"""
