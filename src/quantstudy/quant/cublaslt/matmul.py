"""One cuBLASLt FP8 product, built once and launched many times.

`LtMatmul(problem)` creates the descriptors and layouts of `problem.Problem`; `bind` points the
descriptor at the layer's own scale and bias buffers (device pointers, read at launch, so a CUDA
graph replays them with their current values); `algorithms` asks the heuristic for its first
few kernels; `choose` times them and keeps the fastest; `launch` is then one `cublasLtMatmul`
call on torch's current stream, so it runs inside stream capture like any torch kernel.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from quantstudy.quant.cublaslt import abi
from quantstudy.quant.cublaslt.library import LtError, check, handle, lib
from quantstudy.quant.cublaslt.problem import ChannelScale, LtOut, Problem

Algo = ctypes.Array[ctypes.c_byte]  # one cublasLtMatmulHeuristicResult_t; the algo is its head


@functools.cache
def workspace(device: int) -> torch.Tensor:
    """The workspace every product on `device` shares (launches on one stream never overlap)."""
    return torch.empty(abi.WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")


class LtMatmul:
    """The descriptors of one `Problem`, its bound pointers and its chosen algorithm."""

    def __init__(self, problem: Problem) -> None:
        reason = problem.refusal()
        if reason:
            raise ValueError(f"cuBLASLt product {problem}: {reason}")
        self.problem = problem
        self._lib = lib()
        self.desc = ctypes.c_void_p()
        check(
            self._lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), abi.COMPUTE_32F, abi.R_32F),
            "matmul descriptor",
        )
        self._set(abi.DESC_TRANSA, ctypes.c_int32(abi.OP_T))
        self._set(abi.DESC_TRANSB, ctypes.c_int32(abi.OP_N))
        self._set(abi.DESC_EPILOGUE, ctypes.c_uint32(problem.epilogue_code))
        self._set(abi.DESC_FAST_ACCUM, ctypes.c_int8(int(problem.fast_accum)))
        if problem.channel_scale is ChannelScale.ALPHA_VECTOR:
            mode = abi.POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST
            self._set(abi.DESC_POINTER_MODE, ctypes.c_int32(mode))
        if problem.channel_scale is ChannelScale.OUTER_VEC:
            self._set(abi.DESC_A_SCALE_MODE, ctypes.c_int32(abi.MATRIX_SCALE_OUTER_VEC_32F))
        if problem.has_bias:
            half = problem.layouts()["c"][3]
            self._set(abi.DESC_BIAS_DATA_TYPE, ctypes.c_int32(half))
        self.layouts = {name: self._layout(*lay) for name, lay in problem.layouts().items()}
        self.algo: Algo | None = None
        self.alpha_vector: torch.Tensor | None = None
        self._bound: tuple[int, ...] = ()

    def _set(self, attr: int, value: ctypes._SimpleCData) -> None:  # type: ignore[type-arg]
        check(
            self._lib.cublasLtMatmulDescSetAttribute(
                self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)
            ),
            f"descriptor attribute {attr}",
        )

    def _layout(self, rows: int, cols: int, ld: int, dtype: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        check(
            self._lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
            "matrix layout",
        )
        return lay

    def bind(
        self,
        w_scale: torch.Tensor,
        x_scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        d_scale: torch.Tensor | None = None,
        aux: torch.Tensor | None = None,
    ) -> None:
        """Point the descriptor at the layer's float32 scales (the weight's, the input's; for an
        FP8 D the factor that maps the output to the next layer's codes, 1 / its scale), its
        alpha vector in `w_scale` where the problem's channel scale is ALPHA_VECTOR (then
        `x_scale` is ignored: the vector holds both), its
        bias in the 16-bit type and, for GELU_AUX, the pre-activation buffer. Cheap when the
        pointers did not move since the last call."""
        ptrs = tuple(
            t.data_ptr() if t is not None else 0 for t in (w_scale, x_scale, bias, d_scale, aux)
        )
        if ptrs == self._bound:
            return
        self.alpha_vector = (
            w_scale if self.problem.channel_scale is ChannelScale.ALPHA_VECTOR else None
        )
        if self.alpha_vector is None:
            self._set(abi.DESC_A_SCALE_POINTER, ctypes.c_void_p(ptrs[0]))
            self._set(abi.DESC_B_SCALE_POINTER, ctypes.c_void_p(ptrs[1]))
        if self.problem.has_bias:
            if bias is None:
                raise ValueError(f"{self.problem.epilogue} needs a bias")
            self._set(abi.DESC_BIAS_POINTER, ctypes.c_void_p(ptrs[2]))
        if self.problem.out is LtOut.FP8:
            if d_scale is None:
                raise ValueError("an FP8 output needs its scale")
            self._set(abi.DESC_D_SCALE_POINTER, ctypes.c_void_p(ptrs[3]))
        if aux is not None:
            self._set(abi.DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p(ptrs[4]))
            self._set(abi.DESC_EPILOGUE_AUX_LD, ctypes.c_int64(self.problem.n))
            self._set(
                abi.DESC_EPILOGUE_AUX_DATA_TYPE, ctypes.c_int32(self.problem.layouts()["c"][3])
            )
        self._bound = ptrs

    def algorithms(self, count: int = 4) -> list[Algo]:
        """The heuristic's first `count` kernels for this problem, best first; LtError
        NOT_SUPPORTED where it has none."""
        pref = ctypes.c_void_p()
        check(self._lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        try:
            size = ctypes.c_uint64(abi.WORKSPACE_BYTES)
            check(
                self._lib.cublasLtMatmulPreferenceSetAttribute(
                    pref, abi.PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), ctypes.sizeof(size)
                ),
                "workspace preference",
            )
            results = (ctypes.c_byte * (abi.HEURISTIC_RESULT_BYTES * count))()
            found = ctypes.c_int32(0)
            lay = self.layouts
            check(
                self._lib.cublasLtMatmulAlgoGetHeuristic(
                    handle(),
                    self.desc,
                    lay["a"],
                    lay["b"],
                    lay["c"],
                    lay["d"],
                    pref,
                    count,
                    results,
                    ctypes.byref(found),
                ),
                "heuristic",
            )
        finally:
            self._lib.cublasLtMatmulPreferenceDestroy(pref)
        if found.value == 0:
            raise LtError("heuristic (no kernel)", abi.NOT_SUPPORTED)
        size_ = abi.HEURISTIC_RESULT_BYTES
        return [
            (ctypes.c_byte * size_).from_buffer_copy(bytes(results)[i * size_ : (i + 1) * size_])
            for i in range(found.value)
        ]

    def launch(
        self,
        w8: torch.Tensor,
        x8: torch.Tensor,
        d: torch.Tensor,
        c: torch.Tensor | None = None,
        algo: Algo | None = None,
    ) -> None:
        """d = epilogue(w_scale x_scale (x8 w8^T) [+ bias] [+ c]), on the current stream. The
        tensors must be contiguous: x8 (m, k), w8 (n, k), d and c (m, n)."""
        algo = algo if algo is not None else self.algo
        one, beta = ctypes.c_float(1.0), ctypes.c_float(self.problem.beta)
        vector = self.alpha_vector
        alpha = ctypes.c_void_p(vector.data_ptr()) if vector is not None else ctypes.byref(one)
        c_ptr = c.data_ptr() if c is not None else 0
        lay = self.layouts
        check(
            self._lib.cublasLtMatmul(
                handle(),
                self.desc,
                alpha,
                w8.data_ptr(),
                lay["a"],
                x8.data_ptr(),
                lay["b"],
                ctypes.byref(beta),
                c_ptr,
                lay["c"],
                d.data_ptr(),
                lay["d"],
                algo,
                workspace(d.device.index or 0).data_ptr(),
                abi.WORKSPACE_BYTES,
                torch.cuda.current_stream(d.device).cuda_stream,
            ),
            "matmul",
        )

    def choose(
        self,
        timer: Callable[[Callable[[], None]], float],
        w8: torch.Tensor,
        x8: torch.Tensor,
        d: torch.Tensor,
        c: torch.Tensor | None = None,
        count: int = 4,
    ) -> list[float]:
        """Time the heuristic's first `count` kernels on `launch`'s operands and keep the
        fastest; returns each one's time as `timer` measured it (a kernel that fails to launch
        is timed as infinity)."""
        algos = self.algorithms(count)
        times = []
        for algo in algos:
            try:
                times.append(timer(functools.partial(self.launch, w8, x8, d, c, algo)))
            except (LtError, RuntimeError):
                times.append(float("inf"))
        best = min(range(len(algos)), key=times.__getitem__)
        if times[best] == float("inf"):
            raise LtError("launch (no heuristic kernel ran)", abi.NOT_SUPPORTED)
        self.algo = algos[best]
        return times
