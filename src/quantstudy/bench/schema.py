"""The benchmark records: one JSON file per `quantstudy bench` command, validated on write and
on read, each carrying the provenance that makes its figures comparable (or not).

Schema history:
  1: first version (speed, gemm, depthwise, kernels and published records).
     Later additions, each optional or a new kind, so every older record still loads: the
     peers record (`peers`: our engines beside torchao's) and Provenance.torchao; the product
     record (`products`: every FP8 product of several models and batches, beside cuBLASLt);
     a peers row's own commit, engine-sources hash and phases (`PeersResult.git_commit`,
     `engine_sources`, `phases`: where its seconds went), absent from older rows; a product
     row's `ours_promote` (how our unlabelled variants summed), which an older record's reader
     takes from the lab switch its provenance names, else 128 (`ProductsBench._sums_read`);
     a peers engine's `provider` (fp16, quantstudy or torchao), which an older record names
     `family` and still reads so (a family is a model's).

`ProductRow` and the product variants' names live in `bench/product_row.py`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError, model_validator

from quantstudy.bench.product_row import FP16_CONV, FP16_MM, ProductRow
from quantstudy.env.switches import FP8_PROMOTE, switches_read
from quantstudy.record import EngineQuality, SpeedSection
from quantstudy.record.base import Section
from quantstudy.record.errors import UserError
from quantstudy.record.io import write_json_atomic
from quantstudy.record.readers import not_a_file, read_bytes
from quantstudy.record.vocab import CompileMode, KernelGroup, PeerProvider

BENCH_SCHEMA_VERSION = 1


class Provenance(Section):
    """Where a record's figures come from. Every field but the date may be unknown (None) for a
    record converted from an older file that did not write it; `note` says what was known."""

    command: str  # the command line that produced the figures
    git_commit: str | None = None
    created_utc: str | None = None  # None: not recorded (a record converted from an older file)
    device: str  # "cuda" or "cpu"
    gpu_name: str | None = None
    gpu_driver: str | None = None
    gpu_capability: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    torch: str | None = None
    triton: str | None = None
    timm: str | None = None
    python: str | None = None
    torchao: str | None = None  # set by the benchmarks that run it (`peers`)
    code: str | None = None  # what the code under test did, where the commit alone does not say
    # the lab switches set for the run (`env/switches.py`), as NAME=VALUE words; None: none
    lab_switches: str | None = None
    note: str | None = None


class Record(Section):
    schema_version: int = BENCH_SCHEMA_VERSION
    provenance: Provenance
    meaningful: bool  # False: timings from a CPU or none at all; not evidence for speed
    meaningless_reason: str | None = None
    # set in the copies a run writes after each row, so a cut run keeps what it finished
    unfinished: str | None = None


# --- speed ---------------------------------------------------------------------------------


class LoggedBatch(Section):
    """One batch of an engine known only from the printed table of its run (the JSON was lost):
    medians and the ratio's quartiles, kernel counts, the FP8 engine's kernel time per group."""

    batch: int
    fp16_ms: float
    fp8_ms: float
    ratio_median: float
    ratio_q1: float
    ratio_q3: float
    fp16_kernels: int
    fp8_kernels: int
    fp8_groups_us: dict[KernelGroup, float]


class EngineSpeed(Section):
    """One FP8 engine of a model timed against the fp16 engine."""

    fp8_kernel: str  # an FP8 backend's name or "fastest" (`quant/backends/`)
    fp8_real: int | None = None  # layers running a real FP8 product (None: not recorded)
    fp8_emulated: int | None = None  # layers quantize-dequantized around an fp16 op
    fp8_stepped_aside: int | None = None  # recipe layers the fastest choice kept in fp16
    epilogue_activations: int | None = None  # activations computed in fused epilogues
    fp8_handoffs: int | None = None  # FP8 layers writing the next FP8 layer's input
    fp8_residual_sums: int | None = None  # fused layers summing a residual in their epilogue
    scaled_mm_output: str | None = None
    speed: SpeedSection | None = None  # the harness's section, as a study records it
    logged: list[LoggedBatch] | None = None  # instead of `speed`, for a run known from its log


class Agreement(Section):
    """Top-1 agreement of the fused and unfused FP8 engines on the same images."""

    n_images: int
    same_top1: int


class SpeedResult(Section):
    model: str
    weights: str | None = None
    recipe: str
    selected: int | None = None  # layers the recipe selected
    engines: list[EngineSpeed]
    fused_vs_unfused: Agreement | None = None
    # The fp16 engine in default mode (the harness's fp16 slot) against itself under
    # max-autotune (its FP8 slot): x above 1 means max-autotune made fp16 faster.
    fp16_max_autotune: SpeedSection | None = None
    fp16_max_autotune_logged: tuple[int, float, float] | None = None  # batch, default, tuned ms
    build_and_time_s: float | None = None


class SpeedBench(Record):
    kind: Literal["speed"] = "speed"
    images: str
    n_images: int
    batches: list[int]
    rounds: int
    iters: int
    compile_mode: CompileMode
    results: list[SpeedResult]


# --- gemm ----------------------------------------------------------------------------------


class GemmRow(Section):
    """One unique FP8 product M x K x N of a model's recipe, every way it was run (us per call)."""

    model: str
    m: int
    k: int
    n: int
    conv_map: list[int] | None = None  # [batch, K, H, W] of a stride-1 1x1 conv
    layers: list[str]
    fused_bytes: int  # FP8 input and weight read, fp16 output written
    roofline_us: float  # fused_bytes at the bandwidth of `GemmBench.bandwidth`
    # variant -> microseconds per call (NaN: a tile the compiler refused)
    us: dict[str, float] = Field(default_factory=dict)
    max_rel_error: dict[str, float] = Field(default_factory=dict)
    best_triton: str | None = None
    refused: dict[str, str] = Field(default_factory=dict)


class GemmBench(Record):
    kind: Literal["gemm"] = "gemm"
    batch: int
    bandwidth: float  # bytes/s of the roofline (`shapes.roofline_bandwidth`)
    timed: str  # what each variant's time is
    results: list[GemmRow]


class ProductsBench(Record):
    kind: Literal["products"] = "products"
    models: list[str]  # "model:recipe" of each row
    batches: list[int]
    peak_fp8_tflops: float | None = None  # the GPU's dense peaks (`speed.ideal.PEAKS`)
    peak_fp16_tflops: float | None = None
    timed: str
    results: list[ProductRow]

    @model_validator(mode="after")
    def _sums_read(self) -> ProductsBench:
        """Rows from before `ours_promote` was kept summed as the lab switch the provenance
        names said, else as the engines of then did: promoting every 128 products."""
        switches = switches_read(self.provenance.lab_switches)
        for row in self.results:
            row.set_promote_read(int(switches.get(FP8_PROMOTE, 128)))
        return self

    def peak_fraction(self, row: ProductRow, variant: str) -> float | None:
        """`variant`'s TFLOP/s over the GPU's dense peak: fp16's for the fp16 variants, FP8's
        for the others."""
        fp16 = variant in (FP16_MM, FP16_CONV)
        peak = self.peak_fp16_tflops if fp16 else self.peak_fp8_tflops
        rate = row.tflops(variant)
        return None if rate is None or not peak else rate / peak


# --- depthwise -----------------------------------------------------------------------------


class DepthwiseRow(Section):
    model: str
    c: int
    k: int
    stride: int
    input: list[int]  # NCHW
    output: list[int]
    pad: list[int]  # top, left
    layers: list[str]
    bytes: dict[str, int]  # variant -> bytes read and written
    roofline_us: dict[str, float]
    us: dict[str, float] = Field(default_factory=dict)
    best_tile: dict[str, list[int]] = Field(default_factory=dict)
    max_rel_error: dict[str, float] = Field(default_factory=dict)


class DepthwiseBench(Record):
    kind: Literal["depthwise"] = "depthwise"
    batch: int
    bandwidth: float
    results: list[DepthwiseRow]


# --- kernels -------------------------------------------------------------------------------


class KernelTime(Section):
    kernel: str
    us: float
    group: KernelGroup


class KernelsBench(Record):
    kind: Literal["kernels"] = "kernels"
    model: str
    recipe: str
    batch: int
    fp8_kernel: str  # an FP8 backend's name or "fastest" (`quant/backends/`)
    # per fresh compile: engine ("fp16", "fp8") -> every kernel of one call, slowest first
    compiles: list[dict[str, list[KernelTime]]]
    # files of generated kernel source written beside the record
    sources: list[str] = Field(default_factory=list)


# --- published figures ---------------------------------------------------------------------


class PublishedFigure(Section):
    model: str
    gpu: str
    tensorrt: str
    opt_level: int | None = None  # None: not stated
    batch: int
    fp16_ms: float | None = None
    fp8_ms: float | None = None
    x: float
    source: str


class PublishedBench(Record):
    """Figures copied from a write-up, not measured here: for comparison only."""

    kind: Literal["published"] = "published"
    title: str
    figures: list[PublishedFigure]


# --- peers ---------------------------------------------------------------------------------


class PeerEngine(Section):
    """One engine of a side-by-side row: built from the row's model and recipe, timed against
    the row's fp16 engine in the same interleaved rounds, scored against fp32 on the same
    images."""

    name: str  # "fp16", "quantstudy fused", "torchao dynamic per-row", ...
    # who built it; an older record names it `family` (read as this)
    provider: PeerProvider = Field(validation_alias=AliasChoices("provider", "family"))
    built: str  # how: the builder and its settings, or torchao's config
    compute_dtype: str
    fp8_layers: int  # the recipe's layers that run a real FP8 product in this engine
    half_layers: dict[str, str] = Field(default_factory=dict)  # recipe layers left out -> why
    # fp16 against this engine; None for fp16 itself. Its `ideal` holds the ideal x of the
    # recipe's layers from this engine's profile (`speed/ideal.py`; the layers it leaves out
    # count as emulated ones), None where not computable (`ideal_missing` says why)
    speed: SpeedSection | None = None
    ideal_missing: str | None = None
    quality: EngineQuality  # against the fp32 model on the row's held-out images


class PeerRefused(Section):
    """An engine of a row that was not built, and why (one line)."""

    name: str
    reason: str


class RowStep(StrEnum):
    """The parts of a peers row's wall time, in the order a row runs them (`bench/peers/run.py`)."""

    PREPARE = "prepare"  # the study's preparation: load, images, calibrate (`detail` says which)
    BUILD = "build"  # an engine assembled (and torchao's quantize_; `fastest`'s kernel choice)
    COMPILE = "compile"  # an engine's first call at a batch: torch.compile and kernel tuning
    TIMING = "timing"  # every batch's interleaved rounds (warm-up, capture) and kernel profiles
    QUALITY = "quality"  # an engine's pass over the held-out images (fp32: the reference's)


class RowPhase(Section):
    """Wall seconds of one part of a row; the parts do not overlap, so with the gaps between
    them they sum to the row's `seconds`."""

    step: RowStep
    engine: str | None = None  # None: the row's, not one engine's (preparation, timing rounds)
    batch: int | None = None
    detail: str | None = None
    seconds: float
    autotune_s: float = 0.0  # of which our kernels' autotuner compiled and timed configs


class PeersResult(Section):
    """One model's row: every engine on the same layers, images and harness."""

    model: str
    weights: str  # the --weights option ("random", a file, a named source)
    weights_detail: str | None = None  # what was loaded, as the study records it
    recipe: str
    selected: int  # layers the recipe selected
    command: str  # the command that measured this row
    images: str
    n_calib: int
    n_images: int  # held-out images the engines were scored on
    seconds: float  # wall time of the row: preparation, builds, compiles, timing, scoring
    engines: list[PeerEngine]
    refused: list[PeerRefused] = Field(default_factory=list)
    # the commit and the hash of the code that makes the row's numbers
    # (`bench/peers/alike.py: ROW_SOURCES`): rows of several commits sit side by side where the
    # hash is the same. None: an older row, measured at its record's commit
    # (`provenance.git_commit`)
    git_commit: str | None = None
    engine_sources: str | None = None
    phases: list[RowPhase] | None = None  # where `seconds` went (None: not recorded)


class PeersBench(Record):
    """Rows of `quantstudy bench peers`, one per model, all measured in one environment (the
    provenance; `--append` refuses a row measured in another) with the same code (one commit, or
    one engine-sources hash: `bench/peers/alike.py`); `provenance.git_commit` is the first row's."""

    kind: Literal["peers"] = "peers"
    batches: list[int]
    rounds: int
    iters: int
    compile_mode: CompileMode
    quality_batch: int  # the batch of the scoring passes: the largest timed one (no new compile)
    results: list[PeersResult]


BenchRecord = Annotated[
    SpeedBench
    | GemmBench
    | DepthwiseBench
    | KernelsBench
    | PublishedBench
    | PeersBench
    | ProductsBench,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[BenchRecord] = TypeAdapter(BenchRecord)


def write_record(path: Path, record: Record) -> None:
    """Write atomically (the models are typed and validated already). Unset optional fields
    (None) are left out, so a record reads the same wherever a later schema added some."""
    write_json_atomic(path, record.model_dump(mode="json", exclude_none=True))


def write_unfinished(out: Path | None, record: Record, done: int, total: int, what: str) -> None:
    """While rows remain (`done` of `total`), write `record` to `out` marked unfinished, so a
    run cut by a time limit keeps what it timed; the finished record is written by the caller."""
    if out is not None and done < total:
        left = f"{total - done} of {total} {what} not timed yet"
        write_record(out, record.model_copy(update={"unfinished": left}))


def read_record(path: Path) -> BenchRecord:
    """One record; a file that is not one is a `UserError` naming it."""
    data = read_bytes(path, "record", "bench record")  # a pipe or folder refused unopened
    try:
        return _ADAPTER.validate_json(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise UserError(f"{path} is not a bench record: {where}: {first['msg']}") from None


def read_folder(folder: Path) -> list[tuple[str, BenchRecord]]:
    """Every `*.json` record of `folder`, by file name (name order; see `report.run_order`)."""
    if (kind := not_a_file(folder)) != "a folder":
        what = "does not exist" if kind == "missing" else f"is {kind or 'a file'}"
        raise UserError(f"{folder} {what}; give a folder of bench records")
    records = [(p.stem, read_record(p)) for p in sorted(folder.glob("*.json"))]
    if not records:
        raise UserError(f"{folder} holds no *.json bench record")
    return records
