"""The private names of torch and Triton that quantstudy uses, imported here and nowhere else.

Checked against torch 2.14.1 with triton 3.8.0 (the default CI) and torch 2.11 (the GPU
machine's image, docs/VERSIONS.md). A release that moves one breaks here, in one place; each is
imported when called (torch._inductor takes seconds). `package/shipped_check.py` is the one
exception: it runs where quantstudy is not importable, so it imports `aoti_load_package` itself.
"""

from __future__ import annotations

from typing import Any


def is_wrapper_subclass(t: Any) -> bool:
    """Whether `t` is a tensor subclass that wraps inner tensors (`__tensor_flatten__`)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(t))


def aoti_compile_and_package(*args: Any, **kwargs: Any) -> Any:
    """`torch._inductor.aoti_compile_and_package`: an exported program as a `.pt2` package."""
    from torch._inductor import aoti_compile_and_package as compile_and_package

    return compile_and_package(*args, **kwargs)


def async_compile_mode() -> Any:
    """Triton's `AsyncCompileMode` (compile a kernel's configs in a thread pool), or None where
    this Triton has none."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # older Triton
        return None
    return AsyncCompileMode
