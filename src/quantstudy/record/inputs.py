"""What a study was asked to do and what it read: config, environment, model, data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)

from quantstudy.record.base import Section
from quantstudy.record.build_spec import DEFAULT_BACKEND, BuildSpec
from quantstudy.record.engines import KernelChoice
from quantstudy.record.errors import UserError
from quantstudy.record.readers import read_json
from quantstudy.record.vocab import (
    FASTEST,
    Accumulation,
    CompileMode,
    Device,
)


class Environment(Section):
    python: str
    platform: str
    cpu: str
    cpu_count: int
    torch_threads: int
    torch: str
    timm: str
    numpy: str
    triton: str | None = None  # None: no Triton here, or recorded before schema 25
    cuda: str | None = None
    cudnn: str | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    gpu_capability: str | None = None
    quantstudy: str
    git_commit: str | None = None
    created_utc: str
    # `env/switches.py`: lab switches set for the study (name -> value); None: none
    lab_switches: dict[str, str] | None = None


class ModelInfo(Section):
    name: str  # as given, e.g. "mobilenetv4_conv_large.e500_r256_in1k"
    architecture: str  # timm architecture, e.g. "mobilenetv4_conv_large"
    pretrained_tag: str | None = None
    weights: Literal["file", "cache", "random", "named"]
    weights_detail: str  # file path, cache id, named source, or "random init, seed N"
    weights_sha256: str | None = None
    random_weights: bool
    seed: int
    num_params: int
    num_classes: int
    # multiply-accumulates of the conv and linear layers on one image at the study's input size,
    # counted by forward hooks (`model/macs.py`); attention's own matmuls are not among them.
    # None: recorded before schema 16
    macs: int | None = None


class Preprocessing(Section):
    input_size: tuple[int, int, int]
    crop_pct: float
    crop_mode: str
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    settings: Literal["train", "test"]  # which of the pretrained config's sizes was used
    source: str  # where the values came from, e.g. "pretrained_cfg of tf_efficientnet_lite0.in1k"


class SkippedImage(Section):
    id: str
    reason: str


class ImageSet(Section):
    role: Literal["calibration", "heldout"]
    folder: str
    labelled: bool
    n_images: int
    n_classes: int | None = None  # None when unlabelled
    per_class_min: int | None = None
    per_class_max: int | None = None
    ids_sha256: str
    # sorted; None for a held-out set whose ids live in the per-image side file beside the
    # record (`study/per_image.py: set_ids`), so study.json stays small at any image count
    ids: list[str] | None = None


class DataInfo(Section):
    data_dir: str
    calib_dir: str | None = None
    class_list: str | None = None
    labelled: bool
    seed: int
    skipped: list[SkippedImage]
    calibration: ImageSet
    heldout: ImageSet
    # held-out images added by `quantstudy extend`, one set per folder, in the order added
    extended: list[ImageSet] = Field(default_factory=list)


def _fspath(value: Any) -> Any:
    """Accept `pathlib.Path` (or any path-like) where the config stores a path as text."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


PathText = Annotated[str, BeforeValidator(_fspath)]
"""A path, kept as the text it was given: a record shows it as typed, never normalised."""

AUTO = "auto"


def _heldout_size(value: Any) -> Any:
    """`--heldout`: a positive count (fixed N), `auto` (every image left) or `auto:MAX`, each
    count at most `MAX_IMAGES`."""
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    head, _, bound = (text or "").partition(":")
    count = text if text is not None and text.isdigit() else bound if head == AUTO else None
    if count is not None and count.isdigit() and int(count) > MAX_IMAGES:
        raise ValueError(
            f"must be at most {MAX_IMAGES} images; more than any image folder "
            "holds (a study uses all there are)"
        )
    if text is not None and text.isdigit() and int(text) > 0:
        return int(text)
    if text == AUTO:
        return AUTO
    if head == AUTO and bound.isdigit() and int(bound) > 0:
        return f"{AUTO}:{int(bound)}"
    raise ValueError(
        f"must be a positive image count, '{AUTO}' or '{AUTO}:MAX' with MAX a positive count"
    )


KernelName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
"""What `--fp8-kernel` names: an FP8 backend (`quant/backends/`; the command line and
`study/guard.py` check it is registered) or "fastest". A record keeps the name it ran, so one
made with a backend this install lacks still loads."""

HeldoutSize = Annotated[int | str, BeforeValidator(_heldout_size)]
"""Held-out images: a count (fixed N), or `auto[:MAX]` (rounds until the quality gates settle)."""

DEFAULT_FP8_KERNEL = DEFAULT_BACKEND  # a backend's name (`quant/backends/`)


# Bounds of the numeric study options, checked when the config is built (before any file is
# read or torch imported), so a typo fails in a second instead of after the quality work.
# The largest timed batch: 4096 images of 224x224 are 2.5 GB of fp32 input alone, and a study
# times every batch size for fp16 and FP8; the engines' activations are many times that, so a
# larger batch cannot be timed on one GPU. `study/guard.py: check_batch_memory` then checks the
# largest batch against the memory of the machine once the model's input size is known.
MAX_BATCH = 4096
# More images than any folder holds is fine (a study uses all there are and says so); this
# bound only catches a number that is not a count of images (ImageNet-21k has 14 million).
MAX_IMAGES = 100_000_000
MAX_SEED = 2**32 - 1  # numpy's and torch's generators take a seed in [0, 2**32)


class StudyConfig(Section):
    """Everything that decides a study: what `quantstudy run` was asked, and the record's
    `config` section.

    One field is one study option: the `run`/`search` command-line options are derived from
    these fields (`cli.py`: flag from the name, choices from the type, default and help from the
    field). A study records its config with the defaults it resolved (`resolved`): the recipe
    source, the policy label and the FP8 kernel. Fields added after version 1 have defaults,
    so every older record's config still loads.
    """

    model: str = Field(description="timm name, optionally with tag")
    weights: str = Field(
        "cache",
        description="checkpoint file, 'cache' (local timm/HF cache, never the network), "
        "'random', or a named source (efficientnet-lite0)",
    )
    data: PathText = Field(
        description="held-out images: ImageNet-style <wnid>/<image> folder or plain folder"
    )
    calib_data: PathText | None = Field(None, description="calibration images from another folder")
    recipe: str | None = Field(
        None, description="built-in recipe name or YAML file (default: family default)"
    )
    calib: StrictInt = Field(500, gt=0, le=MAX_IMAGES, description="calibration images")
    heldout: HeldoutSize = Field(
        1500,
        description="held-out images: a count, or auto[:MAX] to take rounds of images until "
        "every quality gate settles (at most MAX, default every image left)",
    )
    seed: StrictInt = Field(0, ge=0, le=MAX_SEED, description="split and random-weight seed")
    device: Device = Field(Device.CUDA, description="where the engines run")
    batches: tuple[Annotated[StrictInt, Field(ge=1, le=MAX_BATCH)], ...] = Field(
        (1, 32, 128), min_length=1, description="timed batch sizes, comma-separated"
    )
    compile_mode: CompileMode = Field(CompileMode.DEFAULT, description="Inductor compile mode")
    fp8_kernel: KernelName | None = Field(
        None,
        description="FP8 layer kernel: fused (one Triton kernel with scale, bias and "
        "activation) or scaled_mm (torch._scaled_mm, then a separate pass); fastest: the fused "
        "engine with each layer timed in place at the timed batches and the faster kernel "
        "kept, or its float layer where both are slower; default fused",
    )  # None: DEFAULT_FP8_KERNEL. Records before version 3 leave it out: they ran scaled_mm.
    fp8_accumulate: Accumulation | None = Field(
        None,
        description="how the FP8 products sum: promote128 (in float32 every 128 products, as "
        "cuBLASLt without fast accumulation) or fast (all of K in the tensor cores, as "
        "torchao's float8 configs; faster on large products, its cost in quality is the "
        "study's to measure); default fast",
    )  # None in a record: promote128, what every engine before version 21 ran, or a lab interval
    # its environment's lab_switches name (`record/build_spec.py: promote_of`)
    test_settings: StrictBool = Field(
        False, description="use the checkpoint's test-time input size and crop"
    )
    float32_engine: StrictBool = Field(
        False,
        description="also score the FP8 engine built in float32 against its emulation, which "
        "tells the FP8 arithmetic from the half-precision storage between layers",
    )
    policy: PathText | None = Field(None, description="decision policy YAML (default: built-in)")
    class_list: PathText | None = Field(
        None, description="wnids in label order, one a line (default: the 1000 ImageNet classes)"
    )
    strip_prefix: str | None = Field(None, description="strip this prefix from checkpoint keys")
    eval_batch: StrictInt = Field(64, gt=0, le=MAX_BATCH, description="batch of the quality passes")
    speed: StrictBool = Field(True, description="time fp16 against FP8")
    quality: StrictBool = Field(
        True,
        description="score quality: the fp32 reference and the FP8 emulations against every "
        "engine on the held-out images (off: a speed-only study, as for random weights; its "
        "decision is then inconclusive)",
    )
    package: StrictBool = Field(
        False,
        description="also build AOTInductor packages (CUDA) and record their size; minutes",
    )
    out: PathText | None = Field(None, description="study folder (default studies/<model>/<name>/)")

    def __init__(self, **data: Any) -> None:
        """Validate; a bad value is a `ConfigProblem` naming the option (pydantic calls this
        for `model_validate` too, so a record's config is refused alike). Numbers and switches
        are strict:
        a boolean is not a number (`"seed": true` would run seed 1), and neither a number nor
        a string is a boolean; a file or a YAML list that says otherwise is refused."""
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise ConfigProblem(err) from None

    @model_validator(mode="after")
    def _distinct_batches(self) -> StudyConfig:
        if len(set(self.batches)) != len(self.batches):
            raise ValueError(f"batch sizes must differ, got {self.batches}")
        return self

    @model_validator(mode="after")
    def _measures_something(self) -> StudyConfig:
        if not (self.speed or self.quality):
            raise ValueError("--no-speed with --no-quality measures nothing; drop one of them")
        if not self.quality and self.sequential:
            raise ValueError(
                f"--heldout {self.heldout} takes images until the quality gates settle, and "
                "--no-quality scores none; give a count with --heldout"
            )
        if not self.quality and self.float32_engine:
            raise ValueError("--float32-engine is a quality pass; drop it or --no-quality")
        return self

    @property
    def sequential(self) -> bool:
        """`--heldout auto[:MAX]`: rounds of held-out images with a look after each."""
        return isinstance(self.heldout, str)

    @property
    def heldout_bound(self) -> int | None:
        """The most held-out images the study takes (None: every image the folder has left)."""
        if isinstance(self.heldout, int):
            return self.heldout
        _, _, bound = self.heldout.partition(":")
        return int(bound) if bound else None

    def build_spec(
        self,
        replay: KernelChoice | None = None,
        switches: dict[str, str] | None = None,
        *,
        recorded: bool = False,
    ) -> BuildSpec:
        """What the study's FP8 engine computes (`record/build_spec.py`): its kernel, or for
        "fastest" the choice per layer, timed at the study's batches unless `replay` gives the
        choice a study recorded; summing as `fp8_accumulate` says, else as the lab switch does.
        `switches`: the lab switches (default: this process's); `recorded`: the spec of a
        recorded study built again (its package, its extension), `switches` those it ran under."""
        option = self.fp8_kernel or DEFAULT_FP8_KERNEL
        kernel: str | KernelChoice = str(option)
        if option == FASTEST:
            kernel = replay if replay is not None else KernelChoice.timed(self.batches)
        return BuildSpec.made(kernel, self.fp8_accumulate, switches=switches, recorded=recorded)

    def replace(self, **changes: Any) -> StudyConfig:
        """A copy with `changes`, validated again (`model_copy` does not validate)."""
        return StudyConfig(**(self.model_dump(exclude_unset=True) | changes))

    def resolved(self, recipe: str, policy: str, accumulate: Accumulation | None) -> StudyConfig:
        """This config as a study records it: the recipe source and policy label it read, and the
        FP8 kernel and accumulation it ran (`accumulate`: the engines', where it names none:
        `BuildSpec.accumulation`)."""
        kernel = self.fp8_kernel or DEFAULT_FP8_KERNEL
        summed = self.fp8_accumulate or accumulate
        return self.replace(recipe=recipe, policy=policy, fp8_kernel=kernel, fp8_accumulate=summed)

    def study_name(self, recipe: str) -> str:
        return f"{recipe}-seed{self.seed}-{self.device}"

    def out_dir(self, recipe: str) -> Path:
        if self.out is not None:
            return Path(self.out)
        return Path("studies") / self.model.replace("/", "_") / self.study_name(recipe)


def read_config(path: Path | str) -> StudyConfig:
    """A study config from a JSON file of `StudyConfig`'s fields (what `model_dump_json` writes:
    a sweep hands each of its studies one); a bad file or value is a `UserError`."""
    data = read_json(path, "study config", kind="config")
    if not isinstance(data, dict):
        raise UserError(f"study config {path} must be a JSON object of the study's options")
    try:
        return StudyConfig(**data)
    except ConfigProblem as problem:  # named by the file's key, not by an option not given
        raise UserError(f"study config {path}: {_first_problem(problem.error, str)}") from None


class ConfigProblem(UserError):
    """A config value refused, said by its option; `error` keeps pydantic's problems, so a
    reader of a config file can name the file's key instead."""

    def __init__(self, error: ValidationError) -> None:
        super().__init__(_first_problem(error))
        self.error = error


def option(field: str) -> str:
    """The command-line option of a config field: `calib_data` -> `--calib-data`."""
    return "--" + field.replace("_", "-")


def _first_problem(err: ValidationError, name: Callable[[str], str] = option) -> str:
    """One line for the first problem pydantic found, naming the option (`name` of the field:
    its option, or the key of a config file)."""
    e = err.errors()[0]
    where = name(str(e["loc"][0])) if e["loc"] else "study config"
    if e["type"] == "enum":
        expected = e["ctx"]["expected"].replace("'", "")
        return f"{where} must be {expected}, not {e['input']}"
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:
        return msg
    # the reason of an upper bound (a batch of 0 is refused for being below 1, not for not
    # fitting a GPU), or of a range, said for either end
    field = str(e["loc"][0])
    upper = e["type"] == "less_than_equal"
    lower = e["type"] == "greater_than_equal" and field in RANGE_REASONS
    why = BOUND_REASONS.get(field, "") if upper or lower else ""
    return f"{where}: {msg[0].lower()}{msg[1:]} (got {e['input']!r}){why}"


# Why a bound is where it is, said with the refusal (the bounds are above `StudyConfig`).
BOUND_REASONS = {
    "batches": "; the engines' activations at a larger timed batch do not fit one GPU",
    "eval_batch": "; the engines' activations at a larger batch do not fit one GPU",
    "seed": "; numpy's and torch's generators take a seed in [0, 2**32)",
    "calib": "; more than any image folder holds (a study uses all there are)",
    "heldout": "; more than any image folder holds (a study uses all there are)",
}
RANGE_REASONS = frozenset({"seed"})  # whose reason speaks of the whole range
