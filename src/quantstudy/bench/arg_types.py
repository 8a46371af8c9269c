"""The argparse types of `quantstudy bench` options that name several things at once: FP8
kernel options (`--kernels`, `--ours`) and torchao configs (`--torchao`). A wrong name is an
argparse error naming the flag and the names it takes; the backends are read when an option is
parsed, so building the parser imports no torch."""

from __future__ import annotations

import argparse
from enum import StrEnum
from typing import TypeVar

from quantstudy.bench.peers.configs import Peer
from quantstudy.record.vocab import choices

E = TypeVar("E", bound=StrEnum)


def distinct_names(text: str, known: list[str], flag: str, none_ok: bool = False) -> list[str]:
    """`text`, comma-separated distinct names of `known` (or `none` where `none_ok`); anything
    else is an argparse error naming the flag and the names it takes."""
    names = [] if none_ok and text == "none" else text.split(",")
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        alternatives = ", or none;" if none_ok else ","
        raise argparse.ArgumentTypeError(
            f"{flag} takes distinct names from {','.join(known)}{alternatives} not '{text}'"
        )
    return names


def distinct(text: str, vocab: type[E], flag: str, none_ok: bool = False) -> tuple[E, ...]:
    """`distinct_names` of a vocabulary, as its members."""
    return tuple(vocab(n) for n in distinct_names(text, choices(vocab), flag, none_ok))


def kernel_options() -> list[str]:
    """What `--fp8-kernel` takes (`quant/backends/`: the backends' names and "fastest")."""
    from quantstudy.quant import backends

    return backends.options()


def kernels(text: str) -> tuple[str, ...]:
    """`--kernels`: FP8 kernel options to time."""
    return tuple(distinct_names(text, kernel_options(), "--kernels"))


def ours(text: str) -> tuple[str, ...]:
    """`--ours`: our engines, as FP8 kernel options."""
    return tuple(distinct_names(text, kernel_options(), "--ours"))


def peers(text: str) -> tuple[Peer, ...]:
    """`--torchao`: torchao configs, or none."""
    return distinct(text, Peer, "--torchao", none_ok=True)
