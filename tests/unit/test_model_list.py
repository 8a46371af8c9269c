"""Every list of models in one schema, read by one reader (`study/model_list.py`): the zoo's, a
peers rows file, `bench products`' arguments; older spellings of committed lists still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantstudy.bench.product_row import PEER_ROWS
from quantstudy.recipe.family import family_of
from quantstudy.record.errors import UserError
from quantstudy.study.model_list import ModelEntry, parse_model_args, read_model_list
from quantstudy.zoo.catalogue import DEFAULT_LIST

ROOT = Path(__file__).resolve().parents[2]


def _list(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    return path


def test_the_committed_lists_read_in_the_one_schema():
    zoo = read_model_list(DEFAULT_LIST)
    peers = read_model_list(ROOT / "tools/lab/bench/peers-rows.yaml")
    assert len(zoo.entries) >= 50 and len(peers.entries) == 9
    # docs/zoo.md: 57 models from 41 families (the timm module of each, or its split)
    assert (len(zoo.entries), len({e.family for e in zoo.entries})) == (57, 41)
    assert all(isinstance(e, ModelEntry) for e in (*zoo.entries, *peers.entries))
    by_name = {e.name: e for e in peers.entries}
    assert set(map(str, PEER_ROWS)) <= {str(e) for e in peers.entries}
    assert by_name["tf_efficientnet_lite0"].weights == "efficientnet-lite0"


def test_an_entry_s_family_is_the_model_s():
    entry = ModelEntry(name="mobilenetv4_conv_large.e500_r256_in1k", family="anything")  # type: ignore[call-arg]
    assert entry.family == family_of(entry.name) == "mobilenetv4"


def test_older_spellings_read_as_the_one_schema(tmp_path):
    """A peers rows file's rows/model, a zoo list's family, a sweep's recipes on one model."""
    old = _list(
        tmp_path,
        "rows:\n  - {model: test_vit, recipe: generic_linears}\n"
        "  - {model: resnet18, family: resnet, weights: random}\n",
    )
    assert read_model_list(old).entries == (
        ModelEntry(name="test_vit", recipe="generic_linears"),
        ModelEntry(name="resnet18", weights="random"),
    )
    sweep = _list(tmp_path, "models:\n  - {name: resnet18, recipes: [generic_all, generic_all2]}\n")
    with pytest.raises(
        UserError, match=r"line 2: models\.0\.recipe: unknown recipe 'generic_all2'"
    ):
        read_model_list(sweep)  # the entry of its second recipe is checked as its own
    sweep.write_text("models:\n  - {name: resnet18, recipes: [generic_all, generic_default]}\n")
    assert [e.recipe for e in read_model_list(sweep).entries] == ["generic_all", "generic_default"]


def test_files_an_entry_names_are_relative_to_the_list(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.pth").write_bytes(b"")
    recipe = (ROOT / "src/quantstudy/recipe/builtin/generic_all.yaml").read_text()
    (tmp_path / "sub" / "r.yaml").write_text(recipe)
    path = _list(
        tmp_path, "models:\n  - {name: resnet18, weights: sub/w.pth, recipe: sub/r.yaml}\n"
    )
    (entry,) = read_model_list(path).entries
    assert entry.weights == str(tmp_path / "sub" / "w.pth")
    assert entry.recipe == str(tmp_path / "sub" / "r.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "line 1: a model list is a mapping with the one key models"),
        ("models: []\n", "line 1: models: is empty: list at least one"),
        ("models:\n  - {name: resnet18}\nseeds: [0]\n", "list of models .found: models, seeds"),
        ("models:\n  - {name: resnet18, wieghts: random}\n", "line 2: models.0.wieghts: unkn"),
        ("models:\n  - {weights: random}\n", "line 2: models.0.name: required key 'name'"),
        ("models:\n  - {name: 3}\n", r"models.0.name: Input should be a valid string \(got 3"),
        ("models:\n  - {name: resnet18}\n  - {name: resnet18}\n", "line 3: models.1.name: res"),
        ("models:\n  - {name: resnet18}\n  - {name: resnet81}\n", "line 3: models.1.name: unkn"),
        (
            "models:\n  - {name: resnet18, recipe: nope}\n",
            "line 2: models.0.recipe: unknown recipe",
        ),
        ("models:\n  - {name: resnet18, weights: x.pth}\n", "models.0.weights: checkpoint x.pth"),
        (
            "models:\n  - {name: resnet18, recipe: generic_all, recipes: [generic_all]}\n",
            "line 2: models.0: give recipe or recipes, not both",
        ),
    ],
)
def test_a_bad_list_is_one_line_naming_its_line(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        read_model_list(_list(tmp_path, text))


def test_a_list_that_is_not_a_file_is_said(tmp_path):
    with pytest.raises(UserError, match="it is a folder, not a file"):
        read_model_list(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        read_model_list(tmp_path / "missing.yaml")


def test_model_arguments_are_entries_checked_alike():
    assert parse_model_args(["resnet18:generic_all", "test_vit"]) == (
        ModelEntry(name="resnet18", recipe="generic_all"),
        ModelEntry(name="test_vit"),
    )
    for given, message in (
        ([], "no model given"),
        ([":generic_all"], "give model"),
        (["resnet18", "resnet18"], "'resnet18' is given twice"),
        (["resnet81"], "argument 'resnet81': unknown timm model"),
        (["resnet18:nope"], "argument 'resnet18:nope': unknown recipe"),
    ):
        with pytest.raises(UserError, match=message):
            parse_model_args(given)
