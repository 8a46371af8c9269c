"""`quantstudy search MODEL`: the study's own options plus the search's."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantstudy.cli_base.command import Command
from quantstudy.study.cli_options import (
    MODEL_DATA_OPTIONS,
    STUDY_OPTIONS,
    add_config_args,
    model_config,
)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    add_config_args(p, MODEL_DATA_OPTIONS + STUDY_OPTIONS)
    p.add_argument(
        "--gains", type=Path, help="per-layer gains JSON (default: measure them on CUDA)"
    )
    p.add_argument(
        "--batch",
        type=int,
        help="batch of the gains and the prediction (default: largest --batches)",
    )
    p.add_argument(
        "--sensitivity-images",
        type=int,
        default=256,
        help="held-out images scored per layer (default 256)",
    )
    p.add_argument(
        "--all-but", action="store_true", help="also score the recipe with each layer left out"
    )
    p.add_argument(
        "--no-options",
        action="store_true",
        help="search the layer subset only, under the recipe's own FP8 quality options (skips "
        "trying compensating rounding, per-layer calibrators, migration and the propagated fit "
        "first)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.5,
        help="share of the policy's quality budget the search may spend",
    )


def _run(args: argparse.Namespace) -> None:
    from quantstudy.study.guard import preflight

    study = model_config(args)
    preflight(study)  # the same checks as `run`, before torch is imported
    from quantstudy.search.compare import summary_lines
    from quantstudy.search.run import SearchConfig, run_search

    result = run_search(
        SearchConfig(
            study=study.replace(out=None),
            gains=args.gains,
            batch=args.batch,
            sensitivity_images=args.sensitivity_images,
            all_but=args.all_but,
            margin=args.margin,
            out=args.out,
            options=not args.no_options,
        )
    )
    print("\n".join(summary_lines(result.search)))
    print(f"recipe: {result.search.recipe_file}")


SEARCH = Command(
    "find the subset of a candidate recipe that pays under the quality budget", _arguments, _run
)
