"""The one configuration object of a study: frozen, typed, written into study.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantstudy.record import StudyConfigRecord
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import CompileMode, Fp8Kernel, choices

DEFAULT_BATCHES = (1, 32, 128)


@dataclass(frozen=True)
class StudyConfig:
    """Everything that decides a study's numbers. Two runs with equal configs are comparable."""

    model: str
    data: Path
    weights: str = "cache"
    calib_data: Path | None = None
    class_list: Path | None = None
    recipe: str | None = None  # None: the model family's built-in default
    calib: int = 500
    heldout: int = 1500
    seed: int = 0
    device: str = "cuda"
    batches: tuple[int, ...] = DEFAULT_BATCHES
    compile_mode: str = "default"
    fp8_kernel: str = "fused"  # "fused" (one Triton kernel per FP8 layer) or "scaled_mm"
    test_settings: bool = False
    policy: Path | None = None
    out: Path | None = None
    eval_batch: int = 64
    speed: bool = True
    package: bool = False  # also build torch.export + AOTInductor packages and record their size
    strip_prefix: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.calib <= 0 or self.heldout <= 0:
            raise UserError("--calib and --heldout must be positive image counts")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"--device must be cpu or cuda, not '{self.device}'")
        if not self.batches or any(b <= 0 for b in self.batches):
            raise UserError(f"batch sizes must be positive integers, got {self.batches}")
        if len(set(self.batches)) != len(self.batches):
            raise UserError(f"batch sizes must differ, got {self.batches}")
        if self.compile_mode not in choices(CompileMode):
            modes = " or ".join(choices(CompileMode))
            raise UserError(f"--compile-mode must be {modes}, not {self.compile_mode}")
        if self.fp8_kernel not in choices(Fp8Kernel):
            kernels = " or ".join(choices(Fp8Kernel))
            raise UserError(f"--fp8-kernel must be {kernels}, not {self.fp8_kernel}")

    def study_name(self, recipe: str) -> str:
        return f"{recipe}-seed{self.seed}-{self.device}"

    def out_dir(self, recipe: str) -> Path:
        if self.out is not None:
            return Path(self.out)
        return Path("studies") / self.model.replace("/", "_") / self.study_name(recipe)

    def record(self, recipe: str) -> StudyConfigRecord:
        return StudyConfigRecord(
            model=self.model,
            weights=self.weights,
            data=str(self.data),
            calib_data=str(self.calib_data) if self.calib_data else None,
            recipe=recipe,
            calib=self.calib,
            heldout=self.heldout,
            seed=self.seed,
            device=self.device,
            batches=list(self.batches),
            compile_mode=self.compile_mode,
            fp8_kernel=self.fp8_kernel,
            test_settings=self.test_settings,
            policy=str(self.policy) if self.policy else "builtin:default",
        )
