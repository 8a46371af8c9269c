"""`StudyConfig`: one model for the options, the record's config section and the CLI."""

import json
from pathlib import Path

import pytest

from quantstudy.cli import _parser, main
from quantstudy.quant import backends
from quantstudy.record import StudyConfig, StudyRecord
from quantstudy.record.errors import UserError
from quantstudy.record.vocab import Accumulation, CompileMode, choices
from quantstudy.study.cli_options import MODEL_DATA_OPTIONS, STUDY_OPTIONS, model_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run_action(dest: str):
    run = _parser()._subparsers._group_actions[0].choices["run"]
    return next(a for a in run._actions if a.dest == dest)


def test_every_cli_option_is_a_config_field():
    assert set(MODEL_DATA_OPTIONS + STUDY_OPTIONS) <= set(StudyConfig.model_fields)


def test_cli_choices_and_defaults_come_from_the_model():
    assert _run_action("compile_mode").choices == choices(CompileMode)
    assert _run_action("fp8_kernel").choices == backends.options()
    for name in ("calib", "heldout", "seed", "batches", "weights"):
        assert _run_action(name).default == StudyConfig.model_fields[name].default
    assert _run_action("speed").option_strings == ["--no-speed"]
    assert _run_action("quality").option_strings == ["--no-quality"]
    # `run --config FILE` stands in for --data; without it --data is a usage error (exit 2)
    with pytest.raises(SystemExit) as stop:
        main(["run", "m"])
    assert stop.value.code == 2


def test_a_study_measures_something():
    with pytest.raises(UserError, match="--no-speed with --no-quality measures nothing"):
        StudyConfig(model="m", data="d", speed=False, quality=False)
    with pytest.raises(UserError, match="--float32-engine is a quality pass"):
        StudyConfig(model="m", data="d", quality=False, float32_engine=True)
    with pytest.raises(UserError, match="give a count with --heldout"):
        StudyConfig(model="m", data="d", quality=False, heldout="auto")


def test_parsed_options_build_the_config():
    args = _parser().parse_args(
        "run m --data d/ --calib 7 --batches 2,4 --fp8-kernel scaled_mm --no-speed".split()
    )
    config = model_config(args)
    assert config.data == "d"  # a Path, as the CLI parses it, stored as its text
    assert (config.calib, config.batches, config.speed) == (7, (2, 4), False)
    assert config.fp8_kernel == "scaled_mm" and config.heldout == 1500


def test_bad_values_are_one_line_user_errors():
    with pytest.raises(UserError, match="--calib: input should be greater than 0"):
        StudyConfig(model="m", data="d", calib=0)
    with pytest.raises(UserError, match="--compile-mode must be default or max-autotune, not x"):
        StudyConfig(model="m", data="d", compile_mode="x")
    with pytest.raises(UserError, match="batch sizes must differ"):
        StudyConfig(model="m", data="d").replace(batches=(4, 4))


def test_resolved_config_names_what_the_study_read():
    config = StudyConfig(model="m", data=Path("d"), policy=Path("p.yaml"))
    assert config.policy == "p.yaml" and config.fp8_kernel is None
    resolved = config.resolved("builtin:generic_all", "p.yaml", Accumulation.FAST)
    assert resolved.recipe == "builtin:generic_all" and resolved.fp8_kernel == "fused"
    dumped = resolved.model_dump(mode="json")
    assert dumped["batches"] == [1, 32, 128] and dumped["fp8_kernel"] == "fused"
    assert dumped["fp8_accumulate"] == "fast"  # what the engines ran, where the config says none
    chosen = config.replace(fp8_accumulate=Accumulation.PROMOTE128)
    assert chosen.resolved("r", "p", Accumulation.FAST).fp8_accumulate == Accumulation.PROMOTE128


@pytest.mark.committed("examples")
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("**/study.json")), ids=str)
def test_old_config_sections_load_with_defaults(path):
    raw = json.loads(path.read_text())["config"]
    config = StudyRecord.model_validate(json.loads(path.read_text())).config
    assert config.model_dump(mode="json", exclude_unset=True) == raw
    added = {"class_list": None, "eval_batch": 64, "speed": True, "package": False, "out": None}
    for key, default in added.items():  # fields an older record leaves out take their default
        if key not in raw:
            assert getattr(config, key) == default
