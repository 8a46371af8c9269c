"""The commands of one study: `run`, `demo`, `recipes`, `report`, `decide` and `extend`."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from quantstudy.cli_base.command import Command
from quantstudy.record import StudyConfig
from quantstudy.record.errors import EXIT_COMMON, UserError
from quantstudy.record.inputs import option, read_config
from quantstudy.study.cli_options import (
    CLI_HELP,
    EXIT_STATUS,
    MODEL_DATA_OPTIONS,
    STUDY_OPTIONS,
    add_config_args,
    add_force_arg,
    model_config,
    study_config,
)

if TYPE_CHECKING:
    from quantstudy.record import StudyRecord

# Set in a sweep's studies' environment (`sweep/point.py`): the study stops on SIGINT even where
# it inherited SIGINT ignored (a sweep started as a script's background job passes that on), so
# the stop request is heard.
STOP_ON_SIGINT = "QUANTSTUDY_STOP_ON_SIGINT"


def print_outcome(record: StudyRecord, report: Path) -> int:
    """Print the decision's closing lines; return the exit status of its outcome."""
    from quantstudy.decision.policy import EXIT_CODES
    from quantstudy.record.vocab import Outcome
    from quantstudy.report.sections.decision import cli_lines

    decision = record.decision
    outcome = decision.outcome if decision is not None else Outcome.INCONCLUSIVE
    verdict = {"ship": "SHIP", "not_ship": "DO NOT SHIP", "inconclusive": "INCONCLUSIVE"}[outcome]
    print(f"\n{record.model.name} / {record.recipe.name if record.recipe else '-'}: {verdict}")
    if decision is not None:
        print("\n".join(cli_lines(decision)))
    if record.timings is not None:
        from quantstudy.study.stage_timer import format_timings

        print(f"\nwall time per stage:\n{format_timings(record.timings)}")
    print(f"report: {report}")
    return EXIT_CODES[outcome]


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        help="timm name, optionally with tag, e.g. mobilenetv4_conv_large.e500_r256_in1k",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="run the study a JSON file of its options describes (StudyConfig's fields, as a "
        "sweep writes one per study) instead of MODEL and options",
    )
    add_config_args(p, MODEL_DATA_OPTIONS + STUDY_OPTIONS, optional=("data",))
    add_force_arg(p)


def _run_check(args: argparse.Namespace) -> str | None:
    if args.config is None and (args.model is None or args.data is None):
        return "run needs MODEL and --data DIR (or --config FILE alone)"
    return None


def _run(args: argparse.Namespace) -> int:
    from quantstudy.study.guard import preflight

    if os.environ.get(STOP_ON_SIGINT) == "1":  # a sweep's study: its stop request is SIGINT
        signal.signal(signal.SIGINT, signal.default_int_handler)

    config = _run_config(args)
    preflight(config)  # bad paths and files refused before torch is even imported
    from quantstudy.study.run import run_study

    return print_outcome(*run_study(config, force=args.force))


def _run_config(args: argparse.Namespace) -> StudyConfig:
    """`run MODEL [options]`, or `run --config FILE` (with --force at most)."""
    if args.config is None:
        return model_config(args)
    parser = argparse.ArgumentParser()
    _run_arguments(parser)
    alone = vars(parser.parse_args(["--config", str(args.config)]))
    given = [k for k, v in alone.items() if getattr(args, k) != v and k not in ("force",)]
    if given:
        flags = ", ".join("MODEL" if k == "model" else option(k) for k in given)
        raise UserError(f"--config {args.config} holds every option; drop {flags} (or edit it)")
    return read_config(args.config)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    add_config_args(p, STUDY_OPTIONS)
    add_force_arg(p)


def _demo(args: argparse.Namespace) -> int:
    from quantstudy.data.demo import demo_data
    from quantstudy.study.guard import preflight
    from quantstudy.study.run import run_study

    demo = demo_data()
    print(f"demo data: {demo.description}")
    if demo.calib is not None:
        args.calib, args.heldout = demo.calib, demo.heldout
    config = study_config(
        args,
        model="tf_efficientnet_lite0",
        weights="efficientnet-lite0",
        data=demo.data_dir,
        calib_data=demo.calib_dir,
        class_list=demo.class_list,
    )
    preflight(config)
    print_outcome(*run_study(config, force=args.force))
    return 0  # a demonstration: its decision is the report's answer, not a failure


def _recipes_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="recipes_command")
    show = sub.add_parser("show", help="resolve a recipe against a model")
    show.add_argument("name", nargs="?", help="recipe (default: the model's family default)")
    show.add_argument("--model", required=True)
    show.add_argument("--json", action="store_true")


def _recipes(args: argparse.Namespace) -> None:
    from quantstudy.recipe.show import format_recipe_list

    if args.recipes_command != "show":
        print(format_recipe_list())
        return
    import torch

    from quantstudy.model.loading import load_model
    from quantstudy.model.preprocess import resolve_preprocessing
    from quantstudy.recipe.builtin import default_choice, load_recipe
    from quantstudy.recipe.resolve import resolve
    from quantstudy.recipe.show import format_resolution

    loaded = load_model(args.model, "random")
    choice = default_choice(loaded.info.architecture)
    chosen = None if args.name else choice.describe()
    recipe, _ = load_recipe(args.name or choice.recipe)
    pre = resolve_preprocessing(loaded.model)
    res = resolve(recipe, loaded.model, torch.zeros(1, *pre.input_size))
    print(format_resolution(res, recipe.name, args.model, as_json=args.json, chosen=chosen))


def _study_dir_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", type=Path)


def _report(args: argparse.Namespace) -> None:
    from quantstudy.report.render import render_study
    from quantstudy.study.guard import holding

    with holding(args.study_dir):  # as `run` holds it: never beside a run writing the record
        print(render_study(args.study_dir))


def _decide_arguments(p: argparse.ArgumentParser) -> None:
    _study_dir_argument(p)
    p.add_argument("--policy", help=CLI_HELP["policy"])


def _decide(args: argparse.Namespace) -> int:
    from quantstudy.decision.redecide import redecide_file
    from quantstudy.report.render import render_study
    from quantstudy.study.guard import holding

    with holding(args.study_dir):
        record = redecide_file(args.study_dir, args.policy)
        return print_outcome(record, render_study(args.study_dir))


def _extend_arguments(p: argparse.ArgumentParser) -> None:
    """`quantstudy extend DIR --data MORE`: more held-out images for a finished study."""
    _study_dir_argument(p)
    p.add_argument("--data", type=Path, required=True, help="folder of more images")
    p.add_argument(
        "--skip-used",
        action="store_true",
        help="leave out images the study already used instead of refusing the folder",
    )


def _extend(args: argparse.Namespace) -> int:
    from quantstudy.study.extend import extend_study

    return print_outcome(*extend_study(args.study_dir, args.data, args.skip_used))


RUN = Command("run a study of MODEL", _run_arguments, _run, EXIT_STATUS, _run_check)
DEMO = Command(
    "the embedded default study (EfficientNet-Lite0)",
    _demo_arguments,
    _demo,
    f"exit status: 0 whatever the decision (run exits by it), {EXIT_COMMON}",
)
RECIPES = Command("list built-in recipes, or show a resolution", _recipes_arguments, _recipes)
REPORT = Command("(re)render report.md and plots from study.json", _study_dir_argument, _report)
DECIDE = Command(
    "take a study's decision again from its recorded measurements under a policy, "
    "rewrite it in study.json and re-render the report (which says so)",
    _decide_arguments,
    _decide,
    EXIT_STATUS,
)
EXTEND = Command(
    "add held-out images from another folder to a finished study, in rounds until "
    "its quality gates settle, and decide again",
    _extend_arguments,
    _extend,
    EXIT_STATUS,
)
