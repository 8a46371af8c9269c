"""Sweep files, the grid they expand to, and the sweep's pieces that need no study run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _records import build_record

from quantstudy.cli import main
from quantstudy.recipe.schema import CALIBRATORS, parse_recipe
from quantstudy.record import SCHEMA_VERSION, StageTime, TimingsSection
from quantstudy.record.errors import UserError
from quantstudy.record.inputs import read_config
from quantstudy.record.io import write_record
from quantstudy.study.stage_timer import StageTimer, format_timings
from quantstudy.sweep.estimate import estimate
from quantstudy.sweep.grid import expand
from quantstudy.sweep.markdown import render_markdown
from quantstudy.sweep.point import CONFIG_FILE, study_command
from quantstudy.sweep.ray_executor import TOKEN_FILE, _sees_shared, pack, unpack
from quantstudy.sweep.spec import CalibratorName, load_sweep
from quantstudy.sweep.summary import BatchX, SweepRow, SweepSummary, best_per_model

GOOD = """\
models:
  - {name: test_efficientnet, weights: random}
  - name: test_resnet
    weights: random
    recipes: [generic_dense_convs]
recipes: [default, generic_all]
calibrators: [max, mse]
seeds: [0, 1]
data: images
calib: 4
heldout: 8
batches: [1, 2]
speed: false
device: cpu
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "images").mkdir(exist_ok=True)  # GOOD's data folder: a sweep checks it exists
    return path


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as err:
        load_sweep(_write(tmp_path, text))
    return str(err.value)


def test_grid_is_the_product_with_family_defaults_and_per_model_recipes(tmp_path):
    spec = load_sweep(_write(tmp_path, GOOD))
    points = expand(spec, "cpu")
    # test_efficientnet: 2 recipes x 2 calibrators x 2 seeds; test_resnet: 1 x 2 x 2
    assert len(points) == 8 + 4
    assert {p.recipe for p in points if p.config.model == "test_efficientnet"} == {
        "generic_pointwise",  # the family default of an efficientnet
        "generic_all",
    }
    assert {p.recipe for p in points if p.config.model == "test_resnet"} == {"generic_dense_convs"}
    assert spec.settings["data"] == str((tmp_path / "images").resolve())  # relative to the file
    assert len({p.folder_name for p in points}) == len(points)


def test_folder_names_are_stable_and_follow_every_setting(tmp_path):
    first = [p.folder_name for p in expand(load_sweep(_write(tmp_path, GOOD)), "cpu")]
    again = [p.folder_name for p in expand(load_sweep(_write(tmp_path, GOOD)), "cpu")]
    assert first == again
    changed = [
        p.folder_name
        for p in expand(
            load_sweep(_write(tmp_path, GOOD.replace("heldout: 8", "heldout: 9"))), "cpu"
        )
    ]
    assert not set(first) & set(changed)


def test_editing_a_recipe_file_gives_new_folders(tmp_path):
    recipe = _write(tmp_path, "name: r\nrules:\n  - include: {op: conv2d}\n", "r.yaml")
    text = GOOD.replace("[default, generic_all]", "[r.yaml]").replace(
        "    recipes: [generic_dense_convs]\n", ""
    )
    before = expand(load_sweep(_write(tmp_path, text)), "cpu")[0]
    recipe.write_text("name: r\nrules:\n  - include: {op: linear}\n")
    after = expand(load_sweep(_write(tmp_path, text)), "cpu")[0]
    assert before.recipe == after.recipe == str(recipe.resolve())
    assert before.folder_name != after.folder_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("calibrators: [max, mse]", "calibrators: [max, median]"),
            "line 7: calibrators.1: 'median' is not allowed",
        ),
        (
            GOOD.replace("    weights: random\n", "    weigths: random\n"),
            "line 4: models.1.weigths: unknown key 'weigths' (known: name, weights, recipe, s",
        ),
        (GOOD.replace("seeds: [0, 1]", "seeds: [0, 0]"), "line 8: seeds: 0 is listed twice"),
        (GOOD.replace("calib: 4", "calib: -4"), "line 10: calib: Input should be greater than 0"),
        (
            GOOD.replace("data: images\n", ""),
            "sweep.yaml line 1: data: required key 'data' is missing",
        ),
        (GOOD + "calib: 5\n", "line 15: duplicate key 'calib'"),
        (GOOD.replace("seeds: [0, 1]", "seeds: [0, 1"), "line 9: malformed YAML"),
        ("- a list\n", "line 1: a sweep file is a YAML mapping"),
        # a model timm does not have: refused as the file is read (a dry run too), not when its
        # points start
        (
            GOOD.replace("  - name: test_resnet", "  - name: test_resnt"),
            "line 3: models.1.name: unknown timm model 'test_resnt'; did you mean test_resnet",
        ),
        (GOOD.replace("calib: 4", "calib: .inf"), "line 10: .inf is not a finite number"),
    ],
)
def test_bad_sweep_files_are_line_numbered_errors(tmp_path, text, expected):
    assert expected in _error(tmp_path, text)


def test_bad_sweep_file_is_one_line_from_the_cli(tmp_path, capsys):
    path = _write(tmp_path, GOOD.replace("fp8_kernels", "x").replace("seeds: [0, 1]", "seedz: [0]"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"quantstudy: error: {path} line 8: seedz: unknown key 'seedz' (known: "
        + err[0].split("(known: ")[1]
    ]


def test_calibrator_names_are_the_recipes():
    assert [c.value for c in CalibratorName] == list(CALIBRATORS)


def test_derived_recipe_changes_only_the_calibrator(tmp_path):
    point = next(
        p for p in expand(load_sweep(_write(tmp_path, GOOD)), "cpu") if p.calibrator == "mse"
    )
    folder = tmp_path / "point"
    folder.mkdir()
    arg = point.recipe_arg(folder)
    derived = parse_recipe((folder / arg).read_bytes(), arg)
    from quantstudy.recipe.builtin import load_recipe

    original, _ = load_recipe(point.recipe)
    assert derived.name == f"{original.name}-mse" and derived.variant_of == original.name
    assert derived.activations.calibrator == "mse"
    assert derived.activations.params == {k: p.default for k, p in CALIBRATORS["mse"].items()}
    assert derived.rules == original.rules and derived.weights == original.weights
    # the recipe's own calibrator: the recipe is passed on unchanged
    own = next(
        p for p in expand(load_sweep(_write(tmp_path, GOOD)), "cpu") if p.calibrator == "max"
    )
    assert own.recipe_arg(folder) == own.recipe


def test_each_study_gets_its_config_as_json_not_as_flags(tmp_path, capsys):
    point = expand(load_sweep(_write(tmp_path, GOOD)), "cpu")[0]
    folder = tmp_path / "f"
    folder.mkdir()
    config = point.study_config(folder)
    assert config.out == "." and config.recipe == point.recipe  # run in the point's folder
    assert config.model == "test_efficientnet" and config.batches == (1, 2)
    assert not config.speed and config.fp8_kernel == "fused"
    path = folder / CONFIG_FILE
    path.write_text(config.model_dump_json())
    assert read_config(path) == config  # the record's own model writes and reads it
    assert study_command(CONFIG_FILE)[-3:] == ["run", "--config", CONFIG_FILE]
    # the file holds every option: a flag beside it is refused, not silently merged
    assert main(["run", "--config", str(path), "--calib", "3"]) == 1
    assert "holds every option; drop --calib" in capsys.readouterr().err
    path.write_text(config.model_dump_json().replace('"calib":4', '"calib":0'))
    assert main(["run", "--config", str(path)]) == 1
    # the message names the file and its key, not a flag the user did not give
    assert f"study config {path}: calib: input should be greater than 0" in capsys.readouterr().err


def test_estimate_from_recorded_stage_timings(tmp_path):
    points = expand(load_sweep(_write(tmp_path, GOOD)), "cpu")
    assert (
        estimate(points, tmp_path / "out", 2)
        .line()
        .endswith("no estimate (no earlier study of these settings has timings)")
    )
    base = build_record(device="cpu")
    config = base.config.replace(model="test_efficientnet", device="cpu", calib=4, heldout=8)
    for i, total in enumerate((30.0, 50.0, 40.0)):
        folder = tmp_path / "out" / f"s{i}"
        folder.mkdir(parents=True)
        timings = TimingsSection(stages=[], total_s=total)
        record = base.model_copy(update={"config": config, "speed": None, "timings": timings})
        write_record(folder / "study.json", record)
    # a record this quantstudy cannot read (a newer schema's) gives no estimate, and no error
    newer = tmp_path / "out" / "newer"
    newer.mkdir()
    data = json.loads((tmp_path / "out" / "s0" / "study.json").read_text())
    (newer / "study.json").write_text(json.dumps(data | {"schema_version": SCHEMA_VERSION + 1}))
    est = estimate(points, tmp_path / "out", 2)
    assert (est.estimated, est.missing, est.seconds) == (8, 4, 8 * 40.0)  # median 40 s each
    assert "5.3 min of study time for 8 point(s), about 2.7 min on 2 worker(s)" in est.line()
    assert "4 point(s) have no estimate" in est.line()


def test_stage_timer_and_table():
    echoed: list[str] = []
    timer = StageTimer(echo=echoed.append)
    with timer.stage("load"):
        pass
    with pytest.raises(RuntimeError), timer.stage("calibrate"):
        raise RuntimeError  # a failed stage is not recorded
    section = timer.section()
    assert [s.stage for s in section.stages] == ["load"] and section.total_s >= 0
    assert echoed == ["stage load: 0.00 s"]  # one line per finished stage, for the log
    table = format_timings(
        TimingsSection(
            stages=[StageTime(stage="load", seconds=3.0), StageTime(stage="score", seconds=1.0)],
            total_s=5.0,
        )
    )
    assert "load" in table and "60.0%" in table and "(between stages)      1.00   20.0%" in table


def test_pack_unpack_and_shared_folder_check(tmp_path):
    src = tmp_path / "point"
    (src / ".cache").mkdir(parents=True)
    (src / "study.json").write_text("{}")
    (src / ".cache" / "logits.pt").write_bytes(b"\x00\x01")
    dst = tmp_path / "copy"
    unpack(pack(src), dst)
    assert (dst / "study.json").read_text() == "{}"
    assert (dst / ".cache" / "logits.pt").read_bytes() == b"\x00\x01"
    (tmp_path / TOKEN_FILE).write_text("abc")
    assert _sees_shared(str(tmp_path), "abc")
    assert not _sees_shared(str(tmp_path), "abd")
    assert not _sees_shared(str(tmp_path / "elsewhere"), "abc")


def test_ray_missing_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    path = _write(tmp_path, GOOD)
    assert main(["sweep", str(path), "--executor", "ray", "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.strip() == (
        "quantstudy: error: --executor ray needs Ray: pip install 'quantstudy[ray]' "
        "(or use --executor local)"
    )


def _row(recipe: str, x: float, agreement: float, decision: str) -> SweepRow:
    return SweepRow(
        folder=f"m-{recipe}",
        model="m",
        weights="random",
        recipe=recipe,
        calibrator="max",
        seed=0,
        fp8_kernel="fused",
        status="complete",
        x=[
            BatchX(batch=1, median=x * 0.9, q1=0, q3=2),
            BatchX(batch=128, median=x, q1=x - 0.1, q3=x + 0.1),
        ],
        agreement=agreement,
        decision=decision,
    )


def test_best_recipe_is_the_fastest_that_ships_and_markdown_lists_every_row():
    rows = [
        _row("a", 1.5, 0.99, "ship"),
        _row("b", 1.9, 0.90, "not_ship"),
        _row("c", 1.3, 0.995, "ship"),
    ]
    (best,) = best_per_model(rows)
    assert best.folder == "m-a" and "of 2 shipping" in best.why
    (none,) = best_per_model([_row("b", 1.9, 0.90, "not_ship")])
    assert none.folder is None and "none of 1 complete studies ships" in none.why
    md = render_markdown(
        SweepSummary(
            sweep_file="s.yaml",
            executor="local",
            device="cuda",
            counts={"complete": 3},
            rows=rows,
            best=[best],
            plots={"m": "pareto-m.png"},
        )
    )
    assert "| m | m-a | a | max |" in md
    assert "1.500 (1.400-1.600)" in md and "x @ 128 (q1-q3)" in md
    assert md.count("| m | ") == 4 and "![m](pareto-m.png)" in md


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.committed("examples")
@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*/sweep.json")), ids=lambda p: p.parent.name)
def test_committed_sweep_md_is_what_sweep_json_renders(path):
    summary = SweepSummary.model_validate_json(path.read_text())
    assert render_markdown(summary) == (path.parent / "sweep.md").read_text()
    assert all((path.parent / name).is_file() for name in summary.plots.values())
