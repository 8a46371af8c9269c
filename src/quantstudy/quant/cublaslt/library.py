"""Finding cuBLASLt: the libcublasLt that torch's CUDA build loads, opened through ctypes.

torch's CUDA wheels link libcublasLt (it runs torch._scaled_mm), so once CUDA is initialised the
library is in the process and `ctypes.CDLL` by its soname returns that same copy; the folders of
the `nvidia-cublas` wheels are tried after it. On a machine without CUDA nothing is loaded:
`unavailable()` says why in one line and no import fails.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys

from quantstudy.env.machine import gpu_capability, gpu_name
from quantstudy.quant.cublaslt import abi

SONAMES = ("libcublasLt.so.13", "libcublasLt.so.12")


class LtError(RuntimeError):
    """A cuBLASLt call that did not return SUCCESS; `status` is its cublasStatus_t."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"cuBLASLt {what}: {abi.STATUS.get(status, status)}")
        self.status = status

    @property
    def not_supported(self) -> bool:
        """cuBLASLt has no kernel for this combination on this GPU: an answer, not a fault."""
        return self.status == abi.NOT_SUPPORTED


def unavailable() -> str | None:
    """Why cuBLASLt cannot run here, in one line, or None where it can."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a requirement
        return "cuBLASLt needs torch"
    if not torch.cuda.is_available():
        return "cuBLASLt needs a CUDA GPU (torch.cuda.is_available() is False)"
    cuda = torch.device("cuda")
    if gpu_capability(cuda) < (8, 9):
        return f"cuBLASLt's FP8 products need compute capability 8.9 or newer ({gpu_name(cuda)})"
    try:
        lib()
    except OSError as err:
        return f"cuBLASLt not found: {err}"
    return None


def _candidates() -> list[str]:
    """Sonames first (the copy torch loaded), then the nvidia wheels' folders."""
    paths = list(SONAMES)
    for root in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cublas/lib"):
            for soname in SONAMES:
                paths += glob.glob(os.path.join(root, sub, soname))
    return paths


@functools.cache
def lib() -> ctypes.CDLL:
    """The loaded library with the signatures of the calls used; OSError where none loads."""
    import torch

    torch.cuda.init()  # torch's own libcublasLt is then loaded, and found first by its soname
    errors = []
    for path in _candidates():
        try:
            found = ctypes.CDLL(path)
        except OSError as err:
            errors.append(str(err))
            continue
        _declare(found)
        return found
    raise OSError("; ".join(errors[:2]) or "no libcublasLt")


def _declare(cdll: ctypes.CDLL) -> None:
    """argtypes of every call, so that ctypes converts sizes and pointers as C expects."""
    p, i32, u64, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64
    cdll.cublasLtCreate.argtypes = [p]
    cdll.cublasLtMatmulDescCreate.argtypes = [p, i32, i32]
    cdll.cublasLtMatmulDescSetAttribute.argtypes = [p, i32, p, ctypes.c_size_t]
    cdll.cublasLtMatmulDescDestroy.argtypes = [p]
    cdll.cublasLtMatrixLayoutCreate.argtypes = [p, i32, u64, u64, i64]
    cdll.cublasLtMatrixLayoutDestroy.argtypes = [p]
    cdll.cublasLtMatmulPreferenceCreate.argtypes = [p]
    cdll.cublasLtMatmulPreferenceSetAttribute.argtypes = [p, i32, p, ctypes.c_size_t]
    cdll.cublasLtMatmulPreferenceDestroy.argtypes = [p]
    cdll.cublasLtMatmulAlgoGetHeuristic.argtypes = [p, p, p, p, p, p, p, i32, p, p]
    cdll.cublasLtMatmul.argtypes = [p, p, p, p, p, p, p, p, p, p, p, p, p, p, ctypes.c_size_t, p]
    cdll.cublasLtGetVersion.restype = ctypes.c_size_t


def check(status: int, what: str) -> None:
    """Raise LtError unless `status` is SUCCESS."""
    if status != 0:
        raise LtError(what, status)


@functools.cache
def handle() -> ctypes.c_void_p:
    """The process's one cuBLASLt handle (it holds no stream and no GPU state of its own)."""
    h = ctypes.c_void_p()
    check(lib().cublasLtCreate(ctypes.byref(h)), "create")
    return h


def version() -> int:
    """cuBLASLt's version number (e.g. 130100 for 13.1.0)."""
    return int(lib().cublasLtGetVersion())
