"""A study's options on the command line, derived from `StudyConfig`: each field gives its
flag, type, choices, default and help. `run`, `demo`, `search` and the benches take them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from quantstudy.cli_base.command import batches
from quantstudy.quant import backends
from quantstudy.record import StudyConfig
from quantstudy.record.errors import EXIT_COMMON
from quantstudy.record.inputs import PathText, option
from quantstudy.record.vocab import choices

MODEL_DATA_OPTIONS = ("data", "calib_data", "class_list", "weights", "strip_prefix")
STUDY_OPTIONS = (
    "recipe",
    "calib",
    "heldout",
    "seed",
    "device",
    "batches",
    "compile_mode",
    "fp8_kernel",
    "fp8_accumulate",
    "float32_engine",
    "test_settings",
    "policy",
    "speed",
    "quality",
    "package",
    "out",
)
# Options whose choices are no vocabulary but a registry, read when the parser is built.
CLI_CHOICES: dict[str, Callable[[], list[str]]] = {"fp8_kernel": backends.options}
# --device alone defaults to what this machine has, not to the config's default.
CLI_DEFAULTS: dict[str, Any] = {"device": None}
CLI_HELP = {
    "device": "default: cuda when available, else cpu",
    "policy": "decision policy: a preset (default, strict, latency-first) or a YAML file "
    "(default: default)",
}
# Exit status of run and decide: the decision's outcome (EXIT_CODES in decision/policy.py).
EXIT_STATUS = (
    "exit status: 0 ship, 3 not ship (a gate failed), 4 inconclusive (no gate failed, but the "
    f"evidence cannot yet pass one; the report says how many images would settle it), "
    f"{EXIT_COMMON}"
)


def _argument(
    name: str, field: FieldInfo, defaults: Mapping[str, Any] = CLI_DEFAULTS
) -> tuple[list[str], dict[str, Any]]:
    """The argparse flag(s) and keywords of one config field (`defaults`: the command's own
    defaults, where they are not the config's)."""
    optional = get_origin(field.annotation) in (Union, UnionType)
    types = [t for t in get_args(field.annotation) if t is not type(None)] if optional else []
    kind = types[0] if types else field.annotation
    default = defaults.get(name, field.default)
    help_text = CLI_HELP.get(name, field.description or "")
    kw: dict[str, Any] = {"dest": name}
    if kind is bool:
        if default:  # an option that is on unless switched off
            kw |= {"action": "store_false", "help": f"do not {help_text}"}
            return [option(f"no_{name}")], kw
        return [option(name)], kw | {"action": "store_true", "help": help_text}
    if field.is_required():
        kw["required"] = True
    elif default is not None and name not in CLI_HELP:
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text += f" (default {shown})"
    if name in CLI_CHOICES:
        kw["choices"] = CLI_CHOICES[name]()
    elif isinstance(kind, type) and issubclass(kind, StrEnum):
        kw["choices"] = choices(kind)
        default = None if default is None else str(default)
    elif get_origin(kind) is tuple:
        kw["type"] = batches
    elif str in types:  # a count or a word (`--heldout auto`): the config parses the text
        kw["type"] = str
    elif kind is int:
        kw["type"] = int
    elif PathText in types or tuple(field.metadata) == get_args(PathText)[1:]:
        kw["type"] = Path  # so the record shows the path as Path() normalises it
    return [option(name)], kw | {"default": default, "help": help_text}


def add_config_args(
    p: argparse.ArgumentParser,
    names: tuple[str, ...],
    optional: tuple[str, ...] = (),
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One option per `StudyConfig` field of `names`; those in `optional` are not required
    (another option can stand in for them); `defaults`: the command's own, shown in the help."""
    for name in names:
        flags, kw = _argument(
            name, StudyConfig.model_fields[name], CLI_DEFAULTS | dict(defaults or {})
        )
        if name in optional:
            kw |= {"required": False, "default": None}
        p.add_argument(*flags, **kw)


def add_force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a complete study of another configuration in the study folder",
    )


def study_config(args: argparse.Namespace, **fixed: Any) -> StudyConfig:
    """The study config of the parsed options; `fixed` gives the fields the command sets."""
    given = {n: getattr(args, n) for n in STUDY_OPTIONS + MODEL_DATA_OPTIONS if hasattr(args, n)}
    given["device"] = args.device or default_device()
    return StudyConfig(**{k: v for k, v in given.items() if v is not None} | fixed)


def default_device() -> str:
    import torch  # only when --device is not given: importing torch takes seconds

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_config(args: argparse.Namespace) -> StudyConfig:
    """The study config of `run`, `search` and the benches: the model, weights and data."""
    return study_config(args, model=args.model)
