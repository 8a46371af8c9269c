"""quantstudy: does FP8 post-training quantization pay for this timm classifier?

The package root exports only the entry points users call (docs/api.md); everything else lives
in its stage's subpackage (see docs/DESIGN.md). Importing it imports neither torch nor timm and
does no GPU work: each entry point is loaded on first use.

Example::

    import quantstudy, timm
    fp8, plan = quantstudy.quantize(timm.create_model("test_vit"), calibration=images)
    study = quantstudy.run_study(quantstudy.StudyConfig(model="test_vit", data="images/"))
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy exports below are, for a type checker
    from quantstudy.api.engine import EngineModule, load_engine
    from quantstudy.api.quantize import FP8Plan, Quantized, quantize
    from quantstudy.api.study import Study, load_study, run_study
    from quantstudy.record.errors import UserError
    from quantstudy.record.inputs import StudyConfig
    from quantstudy.record.version import __version__

__all__ = [
    "EngineModule",
    "FP8Plan",
    "Quantized",
    "Study",
    "StudyConfig",
    "UserError",
    "__version__",
    "load_engine",
    "load_study",
    "quantize",
    "run_study",
]

# public name -> the module that defines it, imported on first use (`__getattr__`)
_LAZY = {
    "EngineModule": "quantstudy.api.engine",
    "load_engine": "quantstudy.api.engine",
    "FP8Plan": "quantstudy.api.quantize",
    "Quantized": "quantstudy.api.quantize",
    "quantize": "quantstudy.api.quantize",
    "Study": "quantstudy.api.study",
    "load_study": "quantstudy.api.study",
    "run_study": "quantstudy.api.study",
    "UserError": "quantstudy.record.errors",
    "StudyConfig": "quantstudy.record.inputs",
    "__version__": "quantstudy.record.version",
}


def __getattr__(name: str) -> object:
    # Lazy, so `import quantstudy` stays cheap and never imports torch or touches CUDA.
    if name not in _LAZY:
        raise AttributeError(f"module 'quantstudy' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(__all__)  # what a user may call: not the subpackages, not the helpers here
