"""The `quantstudy` command: a thin argparse layer over the library.

User mistakes (`UserError`) and filesystem faults (a full disk, a read-only --out) print one clean
line and exit 1; Ctrl-C prints one line and exits 130; a reader that closes stdout (`| head`)
ends the command quietly with 141; anything else is a bug: its traceback goes to a log file,
the console gets one line with its path, and the exit status is 5 (`cli_crash.py`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from quantstudy.cli_crash import after_readers, guard_readers, reader_gone, report_crash
from quantstudy.cli_parsers import add_extend_parser, add_search_parser, add_sweep_parser
from quantstudy.record.errors import EXIT_COMMON, EXIT_INTERRUPTED, EXIT_USER, UserError
from quantstudy.record.inputs import PathText, StudyConfig, option, read_config
from quantstudy.record.io import filesystem_message
from quantstudy.record.vocab import choices

if TYPE_CHECKING:
    from quantstudy.record import StudyRecord

# The study options of `run`, `search` and `demo`: fields of `StudyConfig`, which gives each its
# flag, type, choices, default and help (`_add_config_args`).
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
    "float32_engine",
    "test_settings",
    "policy",
    "speed",
    "quality",
    "package",
    "out",
)
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


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"batches must look like 1,32,128, not '{text}'") from None


def _argument(name: str, field: FieldInfo) -> tuple[list[str], dict[str, Any]]:
    """The argparse flag(s) and keywords of one config field."""
    optional = get_origin(field.annotation) in (Union, UnionType)
    types = [t for t in get_args(field.annotation) if t is not type(None)] if optional else []
    kind = types[0] if types else field.annotation
    default = CLI_DEFAULTS.get(name, field.default)
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
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        kw["choices"] = choices(kind)
        default = None if default is None else str(default)
    elif get_origin(kind) is tuple:
        kw["type"] = _batches
    elif str in types:  # a count or a word (`--heldout auto`): the config parses the text
        kw["type"] = str
    elif kind is int:
        kw["type"] = int
    elif PathText in types or tuple(field.metadata) == get_args(PathText)[1:]:
        kw["type"] = Path  # so the record shows the path as Path() normalises it
    return [option(name)], kw | {"default": default, "help": help_text}


def _add_config_args(
    p: argparse.ArgumentParser, names: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    """One option per `StudyConfig` field of `names`; those in `optional` are not required
    (another option can stand in for them)."""
    for name in names:
        flags, kw = _argument(name, StudyConfig.model_fields[name])
        if name in optional:
            kw |= {"required": False, "default": None}
        p.add_argument(*flags, **kw)


def _add_force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a complete study of another configuration in the study folder",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantstudy",
        description="Does FP8 post-training quantization pay for this timm classifier?",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a study of MODEL", epilog=EXIT_STATUS)
    run.add_argument(
        "model",
        nargs="?",
        help="timm name, optionally with tag, e.g. mobilenetv4_conv_large.e500_r256_in1k",
    )
    run.add_argument(
        "--config",
        type=Path,
        help="run the study a JSON file of its options describes (StudyConfig's fields, as a "
        "sweep writes one per study) instead of MODEL and options",
    )
    _add_config_args(run, MODEL_DATA_OPTIONS + STUDY_OPTIONS, optional=("data",))
    _add_force_arg(run)

    demo = sub.add_parser(
        "demo",
        help="the embedded default study (EfficientNet-Lite0)",
        epilog=f"exit status: 0 whatever the decision (run exits by it), {EXIT_COMMON}",
    )
    _add_config_args(demo, STUDY_OPTIONS)
    _add_force_arg(demo)

    rec = sub.add_parser("recipes", help="list built-in recipes, or show a resolution")
    rec_sub = rec.add_subparsers(dest="recipes_command")
    show = rec_sub.add_parser("show", help="resolve a recipe against a model")
    show.add_argument("name", nargs="?", help="recipe (default: the model's family default)")
    show.add_argument("--model", required=True)
    show.add_argument("--json", action="store_true")

    add_search_parser(sub, lambda p: _add_config_args(p, MODEL_DATA_OPTIONS + STUDY_OPTIONS))

    report = sub.add_parser("report", help="(re)render report.md and plots from study.json")
    report.add_argument("study_dir", type=Path)

    add_sweep_parser(sub)

    from quantstudy.zoo.commands import add_parser as add_zoo_parser

    add_zoo_parser(sub)  # zoo

    decide = sub.add_parser(
        "decide",
        help="take a study's decision again from its recorded measurements under a policy, "
        "rewrite it in study.json and re-render the report (which says so)",
        epilog=EXIT_STATUS,
    )
    decide.add_argument("study_dir", type=Path)
    decide.add_argument("--policy", help=CLI_HELP["policy"])

    add_extend_parser(sub, EXIT_STATUS)

    from quantstudy.bridge.commands import add_parsers as add_bridge_parsers

    add_bridge_parsers(sub)  # export, import-trt

    from quantstudy.bench.cli import add_bench_parser

    add_bench_parser(sub, _add_config_args)  # `bench/cli.py: BENCHES`

    from quantstudy.package.commands import add_parser as add_package_parser

    add_package_parser(sub)  # package
    return parser


def _config(args: argparse.Namespace, **fixed: Any) -> StudyConfig:
    """The study config of the parsed options; `fixed` gives the fields the command sets."""
    given = {n: getattr(args, n) for n in STUDY_OPTIONS + MODEL_DATA_OPTIONS if hasattr(args, n)}
    given["device"] = args.device or _default_device()
    return StudyConfig(**{k: v for k, v in given.items() if v is not None} | fixed)


def _default_device() -> str:
    import torch  # only when --device is not given: importing torch takes seconds

    return "cuda" if torch.cuda.is_available() else "cpu"


def _model_config(args: argparse.Namespace) -> StudyConfig:
    """The study config of `run` and `search`: the model, its weights and the data from args."""
    return _config(args, model=args.model)


def _print_outcome(record: StudyRecord, report: Path) -> int:
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


def _cmd_run(args: argparse.Namespace) -> int:
    from quantstudy.study.guard import preflight
    from quantstudy.sweep.point import STOP_ON_SIGINT

    if os.environ.get(STOP_ON_SIGINT) == "1":  # a sweep's study: its stop request is SIGINT
        signal.signal(signal.SIGINT, signal.default_int_handler)

    config = _run_config(args)
    preflight(config)  # bad paths and files refused before torch is even imported
    from quantstudy.study.run import run_study

    return _print_outcome(*run_study(config, force=args.force))


def _run_config(args: argparse.Namespace) -> StudyConfig:
    """`run MODEL [options]`, or `run --config FILE` (with --force at most)."""
    if args.config is None:
        return _model_config(args)
    alone = vars(_parser().parse_args(["run", "--config", str(args.config)]))
    given = [k for k, v in alone.items() if getattr(args, k) != v and k not in ("force",)]
    if given:
        flags = ", ".join("MODEL" if k == "model" else option(k) for k in given)
        raise UserError(f"--config {args.config} holds every option; drop {flags} (or edit it)")
    return read_config(args.config)


def _cmd_search(args: argparse.Namespace) -> None:
    from quantstudy.study.guard import preflight

    study = _model_config(args)
    preflight(study)  # the same checks as `run`, before torch is imported
    from quantstudy.search.run import SearchConfig, run_search, summary_lines

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


def _cmd_demo(args: argparse.Namespace) -> int:
    from quantstudy.data.demo import demo_data
    from quantstudy.study.guard import preflight
    from quantstudy.study.run import run_study

    demo = demo_data()
    print(f"demo data: {demo.description}")
    if demo.calib is not None:
        args.calib, args.heldout = demo.calib, demo.heldout
    config = _config(
        args,
        model="tf_efficientnet_lite0",
        weights="efficientnet-lite0",
        data=demo.data_dir,
        calib_data=demo.calib_dir,
        class_list=demo.class_list,
    )
    preflight(config)
    _print_outcome(*run_study(config, force=args.force))
    return 0  # a demonstration: its decision is the report's answer, not a failure


def _cmd_recipes(args: argparse.Namespace) -> None:
    from quantstudy.recipe.show import format_recipe_list

    if args.recipes_command != "show":
        print(format_recipe_list())
        return
    import torch

    from quantstudy.model.loading import load_model
    from quantstudy.model.preprocess import resolve_preprocessing
    from quantstudy.recipe.builtin import default_choice, load_recipe, timm_family
    from quantstudy.recipe.resolve import resolve
    from quantstudy.recipe.show import format_resolution

    loaded = load_model(args.model, "random")
    choice = default_choice(loaded.info.architecture)
    chosen = None if args.name else choice.describe(timm_family(args.model))
    recipe, _ = load_recipe(args.name or choice.recipe)
    pre = resolve_preprocessing(loaded.model)
    res = resolve(recipe, loaded.model, torch.zeros(1, *pre.input_size))
    print(format_resolution(res, recipe.name, args.model, as_json=args.json, chosen=chosen))


def _cmd_report(args: argparse.Namespace) -> None:
    from quantstudy.report.render import render_study
    from quantstudy.study.guard import holding

    with holding(args.study_dir):  # as `run` holds it: never beside a run writing the record
        print(render_study(args.study_dir))


def _cmd_decide(args: argparse.Namespace) -> int:
    from quantstudy.decision.redecide import redecide_file
    from quantstudy.report.render import render_study
    from quantstudy.study.guard import holding

    with holding(args.study_dir):
        record = redecide_file(args.study_dir, args.policy)
        return _print_outcome(record, render_study(args.study_dir))


def _cmd_extend(args: argparse.Namespace) -> int:
    from quantstudy.study.extend import extend_study

    return _print_outcome(*extend_study(args.study_dir, args.data, args.skip_used))


def _cmd_export(args: argparse.Namespace) -> int:
    from quantstudy.bridge.commands import run_export
    from quantstudy.study.guard import holding

    with holding(args.study_dir):
        return run_export(args)


def _cmd_import_trt(args: argparse.Namespace) -> int:
    from quantstudy.bridge.commands import run_import

    return _print_outcome(*run_import(args))


def _cmd_sweep(args: argparse.Namespace) -> int:
    from quantstudy.sweep.run import SweepOptions, run_sweep

    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    out = args.out or Path("sweeps") / args.sweep_file.stem
    options = SweepOptions(
        args.sweep_file, out, args.executor, args.address, args.workers, args.transfer, args.dry_run
    )
    return run_sweep(options)


def _cmd_zoo(args: argparse.Namespace) -> int:
    from quantstudy.zoo.commands import run_command

    return run_command(args, ("quantstudy", *(sys.argv[1:] if args.argv is None else args.argv)))


def _cmd_bench(args: argparse.Namespace) -> None:
    from quantstudy.bench.cli import run_bench

    run_bench(args, lambda: _model_config(args), sys.argv[1:] if args.argv is None else args.argv)


def _cmd_package(args: argparse.Namespace) -> int:
    from quantstudy.package.commands import run_package

    return run_package(args)


COMMANDS = {
    "run": _cmd_run,
    "demo": _cmd_demo,
    "recipes": _cmd_recipes,
    "search": _cmd_search,
    "report": _cmd_report,
    "decide": _cmd_decide,
    "extend": _cmd_extend,
    "sweep": _cmd_sweep,
    "zoo": _cmd_zoo,
    "export": _cmd_export,
    "import-trt": _cmd_import_trt,
    "bench": _cmd_bench,
    "package": _cmd_package,
}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.config is None and (args.model is None or args.data is None):
        parser.error("run needs MODEL and --data DIR (or --config FILE alone)")
    args.argv = argv  # the command line a record names (None: this process's)
    guard_readers()  # a reader that goes away (`| head`) ends the output, not the work
    try:
        status = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit after the last print
    except UserError as e:
        print(f"quantstudy: error: {e}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("\nquantstudy: interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except OSError as e:
        # a full disk, a read-only folder, a cache folder in /proc: one line, not a bug
        message = filesystem_message(e, verb="use")
        if message is None:
            return report_crash(e, args, sys.argv[1:] if argv is None else argv)
        print(f"quantstudy: error: {message}", file=sys.stderr)
        return EXIT_USER
    except Exception as e:  # a bug: its traceback to a log file, one line here (cli_crash.py)
        return report_crash(e, args, sys.argv[1:] if argv is None else argv)
    return after_readers(status or 0)  # run, decide and sweep: their exit status


if __name__ == "__main__":
    sys.exit(main())
