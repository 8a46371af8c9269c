"""quantstudy: does FP8 post-training quantization pay for this timm classifier?

The package root exports only the entry points users call; everything else lives in its stage's
subpackage (see docs/DESIGN.md). Importing it does no GPU work.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy exports below are, for a type checker
    from quantstudy.record.errors import UserError
    from quantstudy.record.version import __version__
    from quantstudy.study.config import StudyConfig
    from quantstudy.study.run import run_study

__all__ = ["StudyConfig", "UserError", "__version__", "run_study"]


def __getattr__(name: str) -> object:
    # Lazy, so `import quantstudy` stays cheap and never imports torch or touches CUDA.
    if name == "__version__":
        from quantstudy.record.version import __version__

        return __version__
    if name == "run_study":
        from quantstudy.study.run import run_study

        return run_study
    if name == "StudyConfig":
        from quantstudy.study.config import StudyConfig

        return StudyConfig
    if name == "UserError":
        from quantstudy.record.errors import UserError

        return UserError
    raise AttributeError(name)
