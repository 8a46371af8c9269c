"""Recipe file parsing: valid files, defaults, and errors that name the file line and the key."""

from __future__ import annotations

import hashlib
import inspect
import textwrap

import pytest

from quantstudy.recipe.schema import CALIBRATORS, Recipe, parse_recipe
from quantstudy.recipe.selectors import Selector
from quantstudy.record.errors import UserError


def parse(text: str, origin: str = "recipe.yaml") -> Recipe:
    return parse_recipe(textwrap.dedent(text).encode(), origin)


def error_of(text: str) -> str:
    with pytest.raises(UserError) as info:
        parse(text)
    return str(info.value)


MINIMAL = """\
name: mine
rules:
  - include: {op: conv2d, kernel: 1}
"""


def test_minimal_recipe_gets_explicit_defaults():
    recipe = parse(MINIMAL)
    assert recipe.format == "fp8_e4m3"
    assert recipe.weights.granularity == "per_channel" and recipe.weights.fold_bn is True
    assert recipe.activations.granularity == "per_tensor"
    assert recipe.activations.calibrator == "max" and recipe.activations.params == {}
    assert recipe.rules[0].action == "include"
    assert recipe.rules[0].selector == Selector(op=["conv2d"], kernel=(1, 1))


def test_one_value_or_a_list_both_normalise_to_lists_and_pairs():
    recipe = parse("""\
        name: mine
        rules:
          - include: {op: [conv2d, linear], kernel: [3, 1], stride: 2, groups: dense}
          - exclude: {name_glob: "blocks.*", stage: [layer1, layer2.], position: last_linear}
    """)
    first, second = recipe.rules
    assert first.selector.op == ["conv2d", "linear"]
    assert first.selector.kernel == (3, 1) and first.selector.stride == (2, 2)
    assert first.selector.groups == ["dense"]
    assert second.selector.name_glob == ["blocks.*"]
    assert second.selector.stage == ["layer1", "layer2."]
    assert second.selector.position == ["last_linear"]


def test_sha256_is_of_the_file_bytes():
    raw = MINIMAL.encode()
    assert parse_recipe(raw, "r.yaml").sha256 == hashlib.sha256(raw).hexdigest()
    # A comment changes the file, so the hash: the record pins the exact file that was used.
    assert parse_recipe(raw + b"# note\n", "r.yaml").sha256 != hashlib.sha256(raw).hexdigest()


def test_recipe_built_in_code_has_a_stable_hash():
    a = Recipe(name="x", rules=[{"include": {"op": "conv2d"}}])
    b = Recipe(name="x", rules=[{"include": {"op": ["conv2d"]}}])
    c = Recipe(name="x", rules=[{"include": {"op": "linear"}}])
    assert a.sha256 == b.sha256 != c.sha256


def test_unknown_selector_names_line_rule_and_known_selectors():
    message = error_of("""\
        name: mine
        description: typo in the third rule
        rules:
          - include: {op: conv2d}
          - exclude: {op: linear}
          - include:
              op: conv2d
              kernal: 1
    """)
    assert message.startswith("recipe.yaml line 8: rules[2].include: unknown selector 'kernal'")
    assert "known: op, kernel, groups" in message


def test_unknown_top_level_key_is_named_with_its_line():
    message = error_of("name: mine\nwieghts: {}\nrules:\n  - include: {}\n")
    assert message.startswith("recipe.yaml line 2: top level: unknown key 'wieghts'")
    assert "weights" in message


def test_unknown_key_in_a_section():
    message = error_of(
        "name: m\nweights:\n  fold_bn: true\n  per_channel: true\nrules: [{include: {}}]\n"
    )
    assert message.startswith("recipe.yaml line 4: weights: unknown key 'per_channel'")
    assert "known: granularity, fold_bn" in message


def test_malformed_yaml_reports_its_line():
    message = error_of("name: mine\nrules:\n  - include: {op: conv2d\n  - exclude: {}\n")
    assert "malformed YAML" in message
    assert message.startswith("recipe.yaml line 4:")


def test_yaml_that_is_not_a_mapping():
    assert "a recipe is a YAML mapping" in error_of("- include: {}\n")
    assert "a recipe is a YAML mapping" in error_of("")


@pytest.mark.parametrize("fmt", ["int8", "nvfp4"])
def test_reserved_formats_are_not_implemented(fmt: str):
    message = error_of(f"name: m\nformat: {fmt}\nrules:\n  - include: {{}}\n")
    assert message.startswith("recipe.yaml line 2: format:")
    assert "not implemented" in message and "fp8_e4m3" in message


def test_unknown_format_lists_known_ones():
    message = error_of("name: m\nformat: fp16\nrules:\n  - include: {}\n")
    assert "unknown format 'fp16'" in message and "fp8_e4m3, int8, nvfp4" in message


def test_bad_selector_value_names_the_value_and_choices():
    message = error_of("name: m\nrules:\n  - include: {op: conv3d}\n")
    assert message.startswith("recipe.yaml line 3: rules[0].include.op[0]:")
    assert "'conv3d'" in message and "conv2d" in message and "linear" in message


def test_rule_needs_exactly_one_action():
    both = error_of("name: m\nrules:\n  - include: {}\n    exclude: {}\n")
    neither = error_of("name: m\nrules:\n  - why: nothing to do\n")
    for message in (both, neither):
        assert "line 3: rules[0]: a rule has exactly one of `include:` or `exclude:`" in message


def test_duplicate_keys_are_rejected_not_silently_overwritten():
    message = error_of("name: a\nname: b\nrules:\n  - include: {}\n")
    assert message == "recipe.yaml line 2: duplicate key 'name'; keep one"


def test_missing_name_and_empty_rules():
    assert "required key 'name' is missing" in error_of("rules:\n  - include: {}\n")
    assert "line 2: rules:" in error_of("name: m\nrules: []\n")


def test_bad_regex_is_reported_at_load_time():
    message = error_of('name: m\nrules:\n  - include: {name_regex: "blocks.(("}\n')
    assert message.startswith("recipe.yaml line 3: rules[0].include.name_regex")
    assert "bad regular expression" in message


def test_kernel_must_be_an_int_or_a_pair():
    assert "rules[0].include.kernel" in error_of(
        "name: m\nrules:\n  - include: {kernel: [1, 2, 3]}\n"
    )
    assert "rules[0].include.kernel" in error_of("name: m\nrules:\n  - include: {kernel: 0}\n")


def test_calibrator_params_are_checked_and_filled_in():
    recipe = parse("""\
        name: m
        activations:
          calibrator: percentile
          params: {percentile: 99.9}
        rules:
          - include: {}
    """)
    assert recipe.activations.params == {"percentile": 99.9}
    mse = parse("name: m\nactivations: {calibrator: mse}\nrules: [{include: {}}]\n")
    assert mse.activations.params == {k: p.default for k, p in CALIBRATORS["mse"].items()}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ("{pct: 99}", "calibrator 'percentile' has no parameter 'pct' (known: percentile)"),
        ("{percentile: 101}", "percentile must be a number in [50, 100], got 101"),
    ],
)
def test_calibrator_param_errors(params: str, expected: str):
    message = error_of(
        "name: m\nactivations:\n  calibrator: percentile\n"
        f"  params: {params}\nrules: [{{include: {{}}}}]\n"
    )
    assert message == f"recipe.yaml line 4: activations.params: {expected}"


def test_max_calibrator_takes_no_params_and_integer_params_must_be_integers():
    assert "has no parameter" in error_of(
        "name: m\nactivations: {calibrator: max, params: {percentile: 99}}\n"
        "rules: [{include: {}}]\n"
    )
    assert "must be an integer" in error_of(
        "name: m\nactivations: {calibrator: entropy, params: {num_candidates: 100.5}}\n"
        "rules: [{include: {}}]\n"
    )


def test_unknown_calibrator():
    message = error_of("name: m\nactivations: {calibrator: minmax}\nrules: [{include: {}}]\n")
    assert "activations.calibrator: Input should be" in message and "(got 'minmax')" in message
    assert "'max'" in message and "'entropy'" in message


def test_calibrator_params_match_the_calibrators_that_use_them():
    """The study passes recipe params to quant's calibrators: names and defaults must agree."""
    from quantstudy.quant.calibration import calibrators as quant

    assert set(quant.CALIBRATORS) == set(CALIBRATORS)
    for name, spec in CALIBRATORS.items():
        signature = inspect.signature(quant.CALIBRATORS[name].__init__)
        taken = {k: p.default for k, p in signature.parameters.items() if k != "self"}
        assert taken == {k: p.default for k, p in spec.items()}, name


def test_gelu_takes_any_or_erf_and_defaults_to_any():
    assert parse(MINIMAL).gelu == "any"
    assert parse("gelu: erf\n" + MINIMAL).gelu == "erf"
    assert parse("gelu: any\n" + MINIMAL).gelu == "any"
    message = error_of("gelu: tanh\n" + MINIMAL)
    assert message.startswith("recipe.yaml line 1") and "gelu" in message and "\n" not in message
