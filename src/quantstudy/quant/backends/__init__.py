"""FP8 product backends, one module each, found by the registry (`registry.py`; the interface:
`base.py`). Import the registry's functions from here: `register`, `get`, `names`,
`available`, `options`."""

from quantstudy.quant.backends.registry import (
    available,
    check_option,
    get,
    names,
    options,
    register,
    unregister,
    usable,
)

__all__ = [
    "available",
    "check_option",
    "get",
    "names",
    "options",
    "register",
    "unregister",
    "usable",
]
