"""One distinct FP8 product of `quantstudy bench products` at one batch, every way it ran, and
the names of the variants every product is judged by (`bench/products.py` times them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr

from quantstudy.record.base import Section
from quantstudy.study.model_list import ModelEntry

CUBLASLT = "cuBLASLt"  # the variant every product is judged against (`bench/products.py`)
# the label of a variant that sums otherwise than the engines (`ProductRow.ours_promote`): all of
# K in the tensor cores, or in float32 every 128 products; cuBLASLt's columns by the same words
OTHER_SUMS = {0: "fast-accum", 128: "promote128"}
CUBLASLT_FAST = f"{CUBLASLT} {OTHER_SUMS[0]}"  # torch._scaled_mm with use_fast_accum
FP16_MM, FP16_CONV = "fp16 cuBLAS", "fp16 cuDNN"  # the fp16 engine's product, by kind
# The models of the peers rows (docs/peers.md) whose products are benched by default, and the
# recipes they are studied with (a model list's entries, `study/model_list.py`); here, where the
# command line reads it without torch.
PEER_ROWS = (
    ModelEntry(name="vit_base_patch16_224", recipe="generic_linears"),
    ModelEntry(name="convnext_tiny", recipe="generic_linears"),
    ModelEntry(name="crossvit_9_240"),
    ModelEntry(name="resnet50", recipe="generic_dense_convs"),
)


class ProductRow(Section):
    """One distinct FP8 product (a linear or 1x1 conv as M x K x N, or a kxk conv as its implicit
    GEMM) at one batch, every way it was run (microseconds; TFLOP/s and the fraction of peak are
    derived from them: `tflops`, `ProductsBench.peak_fraction`)."""

    kind: Literal["matmul", "conv"]
    batch: int
    m: int
    k: int  # a conv's C x KH x KW
    n: int
    conv: list[int] | None = None  # [C, H, W, KH, KW, stride, pad] of a kxk conv
    models: list[str]  # the models with this product
    layers: int  # how many layers of those models run it
    flop: float  # 2 M N K
    us: dict[str, float] = Field(default_factory=dict)  # variant -> us per call (not: refused)
    max_rel_error: dict[str, float] = Field(default_factory=dict)  # ours against float32 sums
    refused: dict[str, str] = Field(default_factory=dict)
    best_ours: str | None = None  # the fastest of our variants an engine can run
    # our variant -> the tile the autotuner chose for it in this run (`tiles.config_words`);
    # a variant absent: a fixed tile, or a choice stored by an earlier process on the machine;
    # None: a record from before this was kept
    tiles: dict[str, str] | None = None
    # the promotion interval of our variants whose label names none (`record/build_spec.py`;
    # 0: fast accumulation); None: a record from before it was kept (`_promote_read`)
    ours_promote: int | None = None
    # what a reader takes for a row without `ours_promote`: set from the record's provenance
    # (`ProductsBench._sums_read`); not written
    _promote_read: int = PrivateAttr(128)

    def set_promote_read(self, promote: int) -> None:
        self._promote_read = promote

    @property
    def fp16_us(self) -> float | None:
        """The fp16 engine's time for this product (cuBLAS, or cuDNN for a conv)."""
        return self.us.get(FP16_MM, self.us.get(FP16_CONV))

    def tflops(self, variant: str) -> float | None:
        t = self.us.get(variant)
        return None if t is None else self.flop / (t * 1e-6) / 1e12

    def promote_of(self, variant: str) -> int:
        """The promotion interval `variant` (one of ours) summed with."""
        named = [n for n, word in OTHER_SUMS.items() if variant.endswith(word)]
        if named:
            return named[0]
        return self._promote_read if self.ours_promote is None else self.ours_promote

    @property
    def cublaslt_alike(self) -> str:
        """cuBLASLt's column that sums as our best variant does: with fast accumulation or not."""
        fast = self.best_ours is not None and self.promote_of(self.best_ours) == 0
        return CUBLASLT_FAST if fast else CUBLASLT

    @property
    def best_over_cublaslt(self) -> float | None:
        """cuBLASLt's time over our best variant's, both summing alike (above 1: ours is
        faster)."""
        if self.best_ours is None or self.cublaslt_alike not in self.us:
            return None
        return self.us[self.cublaslt_alike] / self.us[self.best_ours]
