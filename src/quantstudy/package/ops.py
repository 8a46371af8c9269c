"""The FP8 kernels as ops AOTInductor compiles into a package (`torch.library.triton_op`).

The study's engine calls its Triton kernels from Python `custom_op`s (`quant/fused.py`,
`fused_conv.py`, `fused_dw.py`): opaque to Inductor, so a package of that engine would call back
into quantstudy at run time. Each op here has the same schema as its study twin, under the
namespace `quantstudy_pkg`, and is a `triton_op`: AOTInductor traces into its body, finds the
kernel launches (`wrap_triton`) and compiles them into the package with the tile chosen at
package time (`package/tiles.py`). `package/graph.py` points the exported graph at these ops.

The bodies call the study's own launchers with that fixed tile, so the arguments each kernel
receives are built by the same code the study ran; while the body is traced, the launcher's
kernel is swapped for its `wrap_triton` wrapper. Off CUDA a body is the study op's torch
arithmetic (exact FP8 products summed in float32), which AOTInductor compiles for the CPU: what
the CPU tests package.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.library import triton_op, wrap_triton

from quantstudy.package import tiles
from quantstudy.quant.layers import fused_conv
from quantstudy.quant.layers import fused_depthwise as fused_dw
from quantstudy.quant.layers import fused_matmul as fused

NAMESPACE = "quantstudy_pkg"


@contextlib.contextmanager
def _wrapped(launcher: str) -> Iterator[object]:
    """The launcher's module with its kernel replaced by the traceable wrapper, for the block."""
    module_name, launcher_name, kernel_name = tiles.LAUNCHERS[launcher]
    module = importlib.import_module(module_name)
    kernel = getattr(module, kernel_name)
    setattr(module, kernel_name, wrap_triton(kernel))
    try:
        yield getattr(module, launcher_name)
    finally:
        setattr(module, kernel_name, kernel)


def _launch(launcher: str, args: tuple, kwargs: dict, extra: dict | None = None) -> torch.Tensor:
    """Run the study's launcher with the captured tile of this launch, its kernel traceable;
    `extra` keywords reach the launcher but not the key (the study's launch had none)."""
    tile = tiles.active().lookup(tiles.launch_key(launcher, args, kwargs))
    with _wrapped(launcher) as launch:
        return launch(*args, **kwargs, **(extra or {}), **tile.launch_args())


def _study_body(op) -> object:
    """The Python function behind a study op (its torch arithmetic off CUDA)."""
    return op._init_fn


@triton_op(f"{NAMESPACE}::fp8_gemm", mutates_args=())
def fp8_gemm(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
    residual: torch.Tensor | None = None,
    res_act: str = "none",
    x_inv_divisor: torch.Tensor | None = None,
) -> torch.Tensor:
    """`quant.layers.fused_matmul.fp8_gemm`, packageable."""
    if not xq.is_cuda:
        return _study_body(fused.fp8_gemm)(
            xq, w8, w_scale, x_scale, bias, act, out_dtype, out_scale, round_to, residual,
            res_act, x_inv_divisor,
        )  # fmt: skip
    kwargs = dict(out_scale=out_scale, round_to=round_to, residual=residual, res_act=res_act,
                  x_inv_divisor=x_inv_divisor)  # fmt: skip
    return _launch(
        "fp8_gemm", (xq.contiguous(), w8, w_scale, x_scale, bias, act, out_dtype), kwargs
    )


@triton_op(f"{NAMESPACE}::fp8_gemm_pair", mutates_args=())
def fp8_gemm_pair(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    pair_scale: torch.Tensor,
    round_to: torch.dtype | None,
    residual: torch.Tensor | None,
    res_act: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quant.layers.fused_matmul.fp8_gemm_pair`, packageable."""
    if not xq.is_cuda:
        return _study_body(fused.fp8_gemm_pair)(
            xq, w8, w_scale, x_scale, bias, act, out_dtype, pair_scale, round_to, residual,
            res_act,
        )  # fmt: skip
    q = torch.empty((xq.shape[0], w8.shape[0]), device=xq.device, dtype=torch.float8_e4m3fn)
    kwargs = dict(out_scale=pair_scale, round_to=round_to, residual=residual, res_act=res_act,
                  pair=q)  # fmt: skip
    y = _launch("fp8_gemm", (xq.contiguous(), w8, w_scale, x_scale, bias, act, out_dtype), kwargs)
    return y, q


@triton_op(f"{NAMESPACE}::fp8_gemm_padded", mutates_args=())
def fp8_gemm_padded(
    xq: torch.Tensor,
    w8: torch.Tensor,
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    round_to: torch.dtype | None,
    x_inv_divisor: torch.Tensor | None,
    size: list[int],
    pads: list[int],
) -> torch.Tensor:
    """`quant.layers.fused_matmul.fp8_gemm_padded`, packageable: the product written into the
    interior of the zero-padded buffer, as the study's op writes it (border by `zero_border`).

    Both kernels are handed the whole buffer, no view of it (the product gets the interior's
    origin in it, `fp8_gemm_triton(out_base=...)`). A tracer turns a kernel's write through a
    view into a copy of the view and a scatter back, and torch 2.11's AOTInductor gets both
    wrong for a padded buffer: handed the interior view, the compact copy is shorter than the
    strides the kernel was given (an illegal memory access, pytorch/pytorch#161115, fixed by
    #184050; #192510); handed a 1-D view from the interior's first element, the scatter back
    lands at the buffer's start, not at the view's offset, and moves the border into the
    picture (docs/package.md). Written whole, the buffer also takes no copies, which cost
    several full passes over it."""
    b, h, w = size
    left, right, top, bottom = pads
    n = w8.shape[0]
    if not xq.is_cuda:
        y = fp8_gemm(xq, w8, w_scale, x_scale, bias, act, out_dtype, None, round_to, None,
                     "none", x_inv_divisor)  # fmt: skip
        return F.pad(y.reshape(b, h, w, n), (0, 0, left, right, top, bottom))
    from quantstudy.quant.kernels.border import _zero_border_kernel, zero_border  # Triton

    out = torch.empty((b, h + top + bottom, w + left + right, n), device=xq.device,
                      dtype=out_dtype)  # fmt: skip
    zero_border(out, size, pads, kernel=wrap_triton(_zero_border_kernel))
    kwargs = dict(round_to=round_to, x_inv_divisor=x_inv_divisor,
                  out=out[:, top : top + h, left : left + w])  # fmt: skip
    args = (xq.contiguous(), w8, w_scale, x_scale, bias, act, out_dtype)
    _launch("fp8_gemm", args, kwargs, extra={"out_base": out})
    return out


@triton_op(f"{NAMESPACE}::fp8_conv2d", mutates_args=())
def fp8_conv2d(
    xq: torch.Tensor,
    w_taps: torch.Tensor,
    kernel_hw: list[int],
    w_scale: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    out_scale: torch.Tensor | None = None,
    round_to: torch.dtype | None = None,
) -> torch.Tensor:
    """`quant.fused_conv.fp8_conv2d`, packageable."""
    if not xq.is_cuda:
        return _study_body(fused_conv.fp8_conv2d)(
            xq, w_taps, kernel_hw, w_scale, x_scale, bias, act, out_dtype, stride, padding,
            dilation, out_scale, round_to,
        )  # fmt: skip
    args = (xq, w_taps, tuple(kernel_hw), w_scale, x_scale, bias, act, out_dtype, tuple(stride),
            tuple(padding), tuple(dilation), out_scale, round_to)  # fmt: skip
    return _launch("fp8_conv2d", args, {})


@triton_op(f"{NAMESPACE}::fp8_depthwise", mutates_args=())
def fp8_depthwise(
    xq: torch.Tensor,
    taps: torch.Tensor,
    w_scale: torch.Tensor,
    kernel_hw: list[int],
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    act: str,
    out_dtype: torch.dtype,
    stride: int,
    pad: list[int],
    out_hw: list[int],
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`quant.fused_dw.fp8_depthwise`, packageable."""
    if not xq.is_cuda:
        return _study_body(fused_dw.fp8_depthwise)(
            xq, taps, w_scale, kernel_hw, x_scale, bias, act, out_dtype, stride, pad, out_hw,
            out_scale,
        )  # fmt: skip
    args = (xq, taps, tuple(kernel_hw), bias, stride, tuple(pad), tuple(out_hw), act, x_scale,
            out_scale, out_dtype)  # fmt: skip
    return _launch("fp8_depthwise", args, {"w_scale": w_scale})


# The study's op -> its packageable twin (same schema), for `package/graph.py`.
TWINS = {
    "fp8_gemm": fp8_gemm,
    "fp8_gemm_pair": fp8_gemm_pair,
    "fp8_gemm_padded": fp8_gemm_padded,
    "fp8_conv2d": fp8_conv2d,
    "fp8_depthwise": fp8_depthwise,
}
