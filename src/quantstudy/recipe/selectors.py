"""What a recipe rule can select: the `Selector` model and one matcher per selector key.

A rule's selector is a set of conditions on one candidate layer, all of which must hold (AND).
Each key has exactly one matcher in `MATCHERS`, so adding a selector is one field and one line.
Selectors see a `Candidate`: the facts about a conv2d/linear layer gathered by one forward pass
(`resolve.py`), never the module itself, so matching is pure and deterministic.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from quantstudy.record.base import Section

Op = Literal["conv2d", "linear"]
GroupKind = Literal["dense", "depthwise", "grouped"]
Position = Literal["first_conv", "last_conv", "last_linear"]


@dataclass(frozen=True)
class Candidate:
    """A conv2d or linear layer as the selectors see it.

    `input_hw` is the spatial size of the layer's input in the example forward pass: H x W for a
    conv; for a linear, the map its rows come from: (1, 1) for a (batch, features) input, (T, 1)
    for (batch, T tokens, features), (H, W) for (batch, H, W, features). None: not executed
    (`executed` False) or called without a positional tensor.
    `positions` holds the `position` values that apply (first/last conv or linear in forward order).
    """

    index: int  # place in the candidate order
    name: str
    op: Op
    module_class: str
    kernel: tuple[int, int] | None
    stride: tuple[int, int] | None
    groups: int
    in_channels: int
    out_channels: int
    input_hw: tuple[int, int] | None
    executed: bool = True
    positions: frozenset[str] = frozenset()

    @property
    def group_kind(self) -> GroupKind:
        return group_kind(self.groups, self.in_channels)

    @property
    def kind(self) -> str:
        return layer_kind(self.op, self.kernel, self.groups, self.in_channels)


KINDS = ("conv2d.1x1", "conv2d.depthwise", "conv2d.grouped", "conv2d.kxk", "linear")


def group_kind(groups: int, in_channels: int) -> GroupKind:
    """dense (groups 1, also every linear), depthwise (one group per input channel), grouped."""
    if groups == 1:
        return "dense"
    return "depthwise" if groups == in_channels else "grouped"


def layer_kind(op: str, kernel: tuple[int, int] | None, groups: int, in_channels: int) -> str:
    """The layer's kind in the counts (one of KINDS); depthwise wins over 1x1, so none overlap."""
    if op == "linear":
        return "linear"
    groups_kind = group_kind(groups, in_channels)
    if groups_kind != "dense":
        return f"conv2d.{groups_kind}"
    return "conv2d.1x1" if kernel == (1, 1) else "conv2d.kxk"


# --- value normalisers: YAML lets a user write one value or a list; the model keeps lists -------


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _as_pair(value: Any) -> Any:
    """`3` -> (3, 3); `[3, 1]` stays a pair; anything else is left for pydantic to reject."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return value


Names = Annotated[list[str], BeforeValidator(_as_list), Field(min_length=1)]
Ops = Annotated[list[Op], BeforeValidator(_as_list), Field(min_length=1)]
GroupKinds = Annotated[list[GroupKind], BeforeValidator(_as_list), Field(min_length=1)]
Positions = Annotated[list[Position], BeforeValidator(_as_list), Field(min_length=1)]
Pair = Annotated[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]],
                 BeforeValidator(_as_pair)]  # fmt: skip
PositiveInt = Annotated[int, Field(ge=1)]


class Selector(Section):
    """Conditions on one layer; every key given must hold. An empty selector matches every layer.

    Name patterns (`name_glob`, `name_regex`, `stage`) and `module_class` must each match some
    candidate layer of the model: a pattern that matches nothing is a typo, reported as an error.
    Input-size selectors never match a layer the example pass did not run (`input_hw` None).
    """

    op: Ops | None = None
    kernel: Pair | None = None  # 1 means 1x1; [3, 1] means 3x1
    groups: GroupKinds | None = None  # a linear counts as dense
    stride: Pair | None = None
    in_channels_min: PositiveInt | None = None
    out_channels_min: PositiveInt | None = None
    channels_multiple_of: PositiveInt | None = None  # both in and out channels
    input_hw_min: Pair | None = None  # input map at least H x W (both sides)
    input_hw_max: Pair | None = None  # input map at most H x W (both sides): 1 -> 1x1 maps
    input_larger_than: PositiveInt | None = None  # input map larger than N x N (either side > N)
    module_class: Names | None = None  # exact class name, e.g. Conv2dSame
    name_glob: Names | None = None  # fnmatch on the full module name
    name_regex: Names | None = None  # re.fullmatch on the full module name
    stage: Names | None = None  # module name prefix: "layer1" matches layer1 and layer1.*
    position: Positions | None = None  # first_conv, last_conv: in forward order; last_linear
    executed: bool | None = None  # called as a module in the example pass (false: never called)

    @field_validator("name_regex")
    @classmethod
    def _compiles(cls, patterns: list[str] | None) -> list[str] | None:
        for pattern in patterns or []:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"bad regular expression {pattern!r}: {err}") from None
        return patterns

    def given(self) -> dict[str, Any]:
        """The keys set in this selector, in declaration order."""
        return {k: v for k, v in self if v is not None}

    def matches(self, c: Candidate) -> bool:
        return all(MATCHERS[key](value, c) for key, value in self.given().items())

    def describe(self) -> str:
        """Short text such as `op=conv2d kernel=1x1`, for default reasons."""
        parts = [f"{k}={_show(v)}" for k, v in self.given().items()]
        return " ".join(parts) if parts else "every layer"


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _stage_match(prefix: str, name: str) -> bool:
    """`layer1` matches `layer1` and `layer1.*` but not `layer10.*`; `layer1.` is a raw prefix."""
    if prefix.endswith("."):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


def _glob_match(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)


def _regex_match(pattern: str, name: str) -> bool:
    return re.fullmatch(pattern, name) is not None


def _hw_max(hw: tuple[int, int], c: Candidate) -> bool:
    return c.input_hw is not None and c.input_hw[0] <= hw[0] and c.input_hw[1] <= hw[1]


def _larger_than(n: int, c: Candidate) -> bool:
    return c.input_hw is not None and (c.input_hw[0] > n or c.input_hw[1] > n)


def _hw_min(hw: tuple[int, int], c: Candidate) -> bool:
    return c.input_hw is not None and c.input_hw[0] >= hw[0] and c.input_hw[1] >= hw[1]


MATCHERS: dict[str, Callable[[Any, Candidate], bool]] = {
    "op": lambda v, c: c.op in v,
    "kernel": lambda v, c: c.kernel == v,
    "groups": lambda v, c: c.group_kind in v,
    "stride": lambda v, c: c.stride == v,
    "in_channels_min": lambda v, c: c.in_channels >= v,
    "out_channels_min": lambda v, c: c.out_channels >= v,
    "channels_multiple_of": lambda v, c: c.in_channels % v == 0 and c.out_channels % v == 0,
    "input_hw_min": _hw_min,
    "input_hw_max": _hw_max,
    "input_larger_than": _larger_than,
    "module_class": lambda v, c: c.module_class in v,
    "name_glob": lambda v, c: any(_glob_match(p, c.name) for p in v),
    "name_regex": lambda v, c: any(_regex_match(p, c.name) for p in v),
    "stage": lambda v, c: any(_stage_match(p, c.name) for p in v),
    "position": lambda v, c: bool(c.positions.intersection(v)),
    "executed": lambda v, c: c.executed == v,
}

# Selectors whose every value must name something present in the model (typo protection):
# key -> test of one value against one candidate.
PATTERNS: dict[str, Callable[[str, Candidate], bool]] = {
    "name_glob": lambda p, c: _glob_match(p, c.name),
    "name_regex": lambda p, c: _regex_match(p, c.name),
    "stage": lambda p, c: _stage_match(p, c.name),
    "module_class": lambda p, c: c.module_class == p,
}
