"""The zoo's list of models (`models.yaml` in this folder, or the user's own file) and its shards.

The list is a model list (`study/model_list.py`: the one schema and reader of every list of
models); an entry's family, by which the page and plot group it, is the model's own
(`recipe/family.py`). A shard is every N-th entry from the I-th (`--shard I/N`, 1-based), so each
shard mixes families and model sizes and N shards of one list take about the same time: a list
that needs an hour on one GPU runs as N commands of an hour / N each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from quantstudy.record.errors import UserError
from quantstudy.study.model_list import ModelEntry, ModelList, read_model_list

DEFAULT_LIST = Path(__file__).with_name("models.yaml")
T = TypeVar("T")
# `quantstudy zoo --weights`: random for every model (speed only), or real where present
WeightsMode = Literal["random", "cache"]
ZooEntry = ModelEntry  # one model of the list
Catalogue = ModelList  # a read list: its entries, where it came from, its hash


def load_catalogue(path: Path | None = None) -> Catalogue:
    """The list at `path` (default: the committed one); a mistake is a `UserError` with its line."""
    return read_model_list(path or DEFAULT_LIST, "zoo list")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def take(self, items: Sequence[T]) -> list[T]:
        """Every `count`-th item from the `index`-th; a shard of none is a `UserError` (an
        empty selection is a mistake, never "the whole list")."""
        if self.index > len(items):
            raise UserError(
                f"--shard {self}: the list holds {len(items)} model(s), so shard "
                f"{self.index} would hold none; give I at most {len(items)}"
            )
        return list(items[self.index - 1 :: self.count])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


ALL = Shard(1, 1)


def parse_shard(text: str) -> Shard:
    """`I/N` with 1 <= I <= N, as `--shard` takes it."""
    head, sep, tail = text.partition("/")
    if not (sep and head.isdigit() and tail.isdigit() and 1 <= int(head) <= int(tail)):
        raise UserError(f"--shard {text}: give I/N with 1 <= I <= N, e.g. --shard 2/4")
    return Shard(int(head), int(tail))
