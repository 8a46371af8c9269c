"""The `quantstudy` command: a thin argparse layer over the library.

User mistakes (`UserError`) print one clean line and exit 1; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from quantstudy.record.errors import UserError
from quantstudy.record.vocab import CompileMode, Fp8Kernel, choices


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"batches must look like 1,32,128, not '{text}'") from None


def _add_model_data_args(p: argparse.ArgumentParser) -> None:
    """Where the model's weights and the images come from (run and search)."""
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="held-out images: ImageNet-style <wnid>/<image> folder or plain folder",
    )
    p.add_argument("--calib-data", type=Path, help="calibration images from another folder")
    p.add_argument(
        "--class-list",
        type=Path,
        help="wnids in label order, one a line (default: the 1000 ImageNet classes)",
    )
    p.add_argument(
        "--weights",
        default="cache",
        help="checkpoint file, 'cache' (local timm/HF cache, never the network), "
        "'random', or a named source (efficientnet-lite0); default cache",
    )
    p.add_argument("--strip-prefix", help="strip this prefix from checkpoint keys")


def _add_study_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recipe", help="built-in recipe name or YAML file (default: family default)")
    p.add_argument("--calib", type=int, default=500, help="calibration images (default 500)")
    p.add_argument("--heldout", type=int, default=1500, help="held-out images (default 1500)")
    p.add_argument("--seed", type=int, default=0, help="split and random-weight seed (default 0)")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="default: cuda when available, else cpu",
    )
    p.add_argument(
        "--batches",
        type=_batches,
        default=(1, 32, 128),
        help="timed batch sizes, comma-separated (default 1,32,128)",
    )
    p.add_argument("--compile-mode", choices=choices(CompileMode), default="default")
    p.add_argument(
        "--fp8-kernel",
        choices=choices(Fp8Kernel),
        default="fused",
        help="FP8 layer kernel: fused (one Triton kernel with scale, bias and activation; "
        "default) or scaled_mm (torch._scaled_mm, then a separate pass)",
    )
    p.add_argument(
        "--test-settings",
        action="store_true",
        help="use the checkpoint's test-time input size and crop",
    )
    p.add_argument("--policy", type=Path, help="decision policy YAML (default: built-in)")
    p.add_argument("--no-speed", action="store_true", help="skip the timing stage")
    p.add_argument(
        "--package",
        action="store_true",
        help="also build AOTInductor packages (CUDA) and record their size; minutes",
    )
    p.add_argument("--out", type=Path, help="study folder (default studies/<model>/<name>/)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantstudy",
        description="Does FP8 post-training quantization pay for this timm classifier?",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a study of MODEL")
    run.add_argument(
        "model", help="timm name, optionally with tag, e.g. mobilenetv4_conv_large.e500_r256_in1k"
    )
    _add_model_data_args(run)
    _add_study_args(run)

    demo = sub.add_parser("demo", help="the embedded default study (EfficientNet-Lite0)")
    _add_study_args(demo)

    rec = sub.add_parser("recipes", help="list built-in recipes, or show a resolution")
    rec_sub = rec.add_subparsers(dest="recipes_command")
    show = rec_sub.add_parser("show", help="resolve a recipe against a model")
    show.add_argument("name", nargs="?", help="recipe (default: the model's family default)")
    show.add_argument("--model", required=True)
    show.add_argument("--json", action="store_true")

    search = sub.add_parser(
        "search", help="find the subset of a candidate recipe that pays under the quality budget"
    )
    search.add_argument("model")
    _add_model_data_args(search)
    _add_study_args(search)
    search.add_argument(
        "--gains", type=Path, help="per-layer gains JSON (default: measure them on CUDA)"
    )
    search.add_argument(
        "--batch",
        type=int,
        help="batch of the gains and the prediction (default: largest --batches)",
    )
    search.add_argument(
        "--sensitivity-images",
        type=int,
        default=256,
        help="held-out images scored per layer (default 256)",
    )
    search.add_argument(
        "--all-but", action="store_true", help="also score the recipe with each layer left out"
    )
    search.add_argument(
        "--margin",
        type=float,
        default=0.5,
        help="share of the policy's quality budget the search may spend",
    )

    report = sub.add_parser("report", help="(re)render report.md and plots from study.json")
    report.add_argument("study_dir", type=Path)
    return parser


def _config(args: argparse.Namespace, **fixed):
    import torch

    from quantstudy.study.config import StudyConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return StudyConfig(
        recipe=args.recipe,
        calib=args.calib,
        heldout=args.heldout,
        seed=args.seed,
        device=device,
        batches=args.batches,
        compile_mode=args.compile_mode,
        fp8_kernel=args.fp8_kernel,
        test_settings=args.test_settings,
        policy=args.policy,
        speed=not args.no_speed,
        out=args.out,
        **fixed,
    )


def _model_config(args: argparse.Namespace):
    """The study config of `run` and `search`: the model, its weights and the data from args."""
    return _config(
        args,
        model=args.model,
        data=args.data,
        calib_data=args.calib_data,
        class_list=args.class_list,
        weights=args.weights,
        strip_prefix=args.strip_prefix,
    )


def _print_outcome(record, report: Path) -> None:
    decision = record.decision
    verdict = "SHIP" if decision and decision.ship else "DO NOT SHIP"
    print(f"\n{record.model.name} / {record.recipe.name if record.recipe else '-'}: {verdict}")
    if decision is not None:
        print(decision.summary)
        for gate in decision.gates:
            mark = "pass" if gate.passed else "FAIL"
            print(f"  [{mark}] {gate.name}: {gate.measured} (needs {gate.threshold})")
    print(f"report: {report}")


def _cmd_run(args: argparse.Namespace) -> None:
    from quantstudy.study.run import run_study

    config = _model_config(args)
    _print_outcome(*run_study(config))


def _cmd_search(args: argparse.Namespace) -> None:
    from quantstudy.search.run import SearchConfig, run_search, summary_lines

    study = _model_config(args)
    result = run_search(
        SearchConfig(
            study=replace(study, out=None),
            gains=args.gains,
            batch=args.batch,
            sensitivity_images=args.sensitivity_images,
            all_but=args.all_but,
            margin=args.margin,
            out=args.out,
        )
    )
    print("\n".join(summary_lines(result.search)))
    print(f"recipe: {result.search.recipe_file}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from quantstudy.data.demo import demo_data
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
    _print_outcome(*run_study(config))


def _cmd_recipes(args: argparse.Namespace) -> None:
    from quantstudy.recipe.show import format_recipe_list

    if args.recipes_command != "show":
        print(format_recipe_list())
        return
    import torch

    from quantstudy.model.loading import load_model
    from quantstudy.model.preprocess import resolve_preprocessing
    from quantstudy.recipe.builtin import default_recipe_for, load_recipe
    from quantstudy.recipe.resolve import resolve
    from quantstudy.recipe.show import format_resolution

    loaded = load_model(args.model, "random")
    name = args.name or default_recipe_for(loaded.info.architecture)
    recipe, _ = load_recipe(name)
    pre = resolve_preprocessing(loaded.model)
    res = resolve(recipe, loaded.model, torch.zeros(1, *pre.input_size))
    print(format_resolution(res, recipe.name, args.model, as_json=args.json))


def _cmd_report(args: argparse.Namespace) -> None:
    from quantstudy.report.render import render_study

    print(render_study(args.study_dir))


COMMANDS = {
    "run": _cmd_run,
    "demo": _cmd_demo,
    "recipes": _cmd_recipes,
    "search": _cmd_search,
    "report": _cmd_report,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except UserError as e:
        print(f"quantstudy: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
