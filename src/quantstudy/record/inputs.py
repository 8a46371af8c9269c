"""What a study was asked to do and what it read: config, environment, model, data."""

from __future__ import annotations

from typing import Literal

from quantstudy.record.base import Section
from quantstudy.record.vocab import CompileMode, Fp8Kernel


class Environment(Section):
    python: str
    platform: str
    cpu: str
    cpu_count: int
    torch_threads: int
    torch: str
    timm: str
    numpy: str
    cuda: str | None = None
    cudnn: str | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    gpu_capability: str | None = None
    quantstudy: str
    git_commit: str | None = None
    created_utc: str


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
    ids: list[str]


class DataInfo(Section):
    data_dir: str
    calib_dir: str | None = None
    class_list: str | None = None
    labelled: bool
    seed: int
    skipped: list[SkippedImage]
    calibration: ImageSet
    heldout: ImageSet


class StudyConfigRecord(Section):
    model: str
    weights: str
    data: str
    calib_data: str | None = None
    recipe: str
    calib: int
    heldout: int
    seed: int
    device: str
    batches: list[int]
    compile_mode: CompileMode
    fp8_kernel: Fp8Kernel | None = None  # None in records before version 3: they ran "scaled_mm"
    test_settings: bool
    policy: str
