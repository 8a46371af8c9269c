"""The numbers of cuBLASLt's C interface that quantstudy uses, as `cublasLt.h` and
`library_types.h` define them (CUDA 12 and 13 agree on every one used here; checked against
NVIDIA's own bindings, nvmath-python's `cycublasLt.pxd`).

Kept as plain integers: ctypes passes them as they are, and a test pins them so that an edit
that mistypes one fails on the CPU rather than as an INVALID_VALUE on the GPU.
"""

from __future__ import annotations

# cudaDataType_t
R_32F = 0
R_16F = 2
R_16BF = 14
R_8F_E4M3 = 28

# cublasComputeType_t
COMPUTE_32F = 68

# cublasOperation_t
OP_N = 0
OP_T = 1

# cublasLtMatmulDescAttributes_t, with the C type each attribute takes
DESC_POINTER_MODE = 2  # int32
DESC_TRANSA = 3  # int32
DESC_TRANSB = 4  # int32
DESC_EPILOGUE = 7  # uint32
DESC_BIAS_POINTER = 8  # void*
DESC_EPILOGUE_AUX_POINTER = 11  # void*
DESC_EPILOGUE_AUX_LD = 12  # int64
DESC_A_SCALE_POINTER = 17  # void* (float32 on the device)
DESC_B_SCALE_POINTER = 18  # void*
DESC_D_SCALE_POINTER = 20  # void*
DESC_AMAX_D_POINTER = 21  # void*
DESC_EPILOGUE_AUX_DATA_TYPE = 22  # int32
DESC_FAST_ACCUM = 25  # int8
DESC_BIAS_DATA_TYPE = 26  # int32
DESC_A_SCALE_MODE = 31  # int32

# cublasLtPointerMode_t: alpha a device vector along D's rows (our output features), beta on
# the host
POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4
# cublasLtMatmulMatrixScale_t: one float32 per row of op(A) (our output features)
MATRIX_SCALE_OUTER_VEC_32F = 3

# cublasLtEpilogue_t
EPILOGUE_DEFAULT = 1
EPILOGUE_RELU = 2
EPILOGUE_BIAS = 4
EPILOGUE_RELU_BIAS = 6
EPILOGUE_GELU = 32
EPILOGUE_GELU_BIAS = 36
EPILOGUE_GELU_AUX_BIAS = 164

# cublasLtMatmulPreferenceAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1  # uint64

# sizeof(cublasLtMatmulHeuristicResult_t): algo (8 x uint64), workspaceSize (size_t), state
# (int32), wavesCount (float), reserved (4 x int32)
HEURISTIC_RESULT_BYTES = 96
# The workspace torch gives cuBLASLt on Hopper, as cuBLAS recommends (pytorch/pytorch#120925).
WORKSPACE_BYTES = 32 * 1024 * 1024

# cublasStatus_t, by name, for messages
STATUS = {
    0: "SUCCESS",
    1: "NOT_INITIALIZED",
    3: "ALLOC_FAILED",
    7: "INVALID_VALUE",
    8: "ARCH_MISMATCH",
    11: "MAPPING_ERROR",
    13: "EXECUTION_FAILED",
    14: "INTERNAL_ERROR",
    15: "NOT_SUPPORTED",
    16: "LICENSE_ERROR",
}
NOT_SUPPORTED = 15
