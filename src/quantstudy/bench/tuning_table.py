"""`quantstudy bench tuning-table`: the shipped tuning table of each GPU a machine's store of
tuned choices holds (`quant/kernels/table.py`), written where the package reads its tables
(`quant/kernels/tables/`, committed as package data) or to `--out`.

Run on the GPU machine after a zoo run (the `zoo-rows` job of `tools/device/jobs/records.yaml`):
the store then holds every launch the list made, and the table of that GPU, merged with the one
committed, lets the next bare machine of that GPU launch them without tuning. Arguments parse
without torch or Triton (the CLI's parser is built without them); running imports the kernels.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantstudy.record.errors import UserError


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from", dest="store", type=Path, metavar="STORE",
        help="a tuning store (triton_tuning.json; default: this machine's, beside Inductor's "
        "cache)",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, metavar="FOLDER",
        help="the folder of tables, one JSON per GPU (default: the package's, "
        "quant/kernels/tables)",
    )  # fmt: skip


def tabled_kernels() -> dict[str, str]:
    """The kernels a table holds choices of, name -> today's source hash: the fused FP8
    product, the kxk conv and the depthwise conv."""
    from quantstudy.quant.kernels.conv import FP8_CONV
    from quantstudy.quant.kernels.depthwise import DEPTHWISE
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.quant.kernels.kernel_source import kernel_source_sha

    return {t.name: kernel_source_sha(t.kernel) for t in (FP8_GEMM, FP8_CONV, DEPTHWISE)}


def run(args: argparse.Namespace, _: Any = None) -> None:
    """Build the tables; a store that is missing or holds no choice a table keeps is one line."""
    from quantstudy.quant.kernels import choices, table

    store = args.store or choices.store_path()
    if not store.is_file():
        raise UserError(
            f"--from {store}: no tuning store there; a study or the zoo on a GPU writes one "
            f"({choices.FILE}, beside Inductor's cache), or name it with --from"
        )
    built, skipped = table.build_tables(store, args.out or table.TABLES, tabled_kernels())
    left = "; ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    if not built:
        raise UserError(
            f"{store} holds no choice a table keeps ({left or 'it is empty or unreadable'})"
        )
    for b in built:
        print(
            f"tuning table: {b.path}: {b.gpu}, {b.entries} entries ({b.from_store} from the store)"
        )
    if left:
        print(f"tuning table: left out of {store}: {left}")
