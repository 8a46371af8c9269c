"""The engines' accumulation and its lab switch, as the build spec holds them
(`record/build_spec.py`), and the record of every lab switch a study or bench ran under
(`env/switches.py`)."""

from __future__ import annotations

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from torch import nn

from quantstudy.env.switches import FP8_PROMOTE
from quantstudy.quant.layers.matmul import FP8Matmul
from quantstudy.quant.layers.spec import FP8LayerSpec
from quantstudy.record.build_spec import PROMOTE, BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.study.environment import collect_environment


@pytest.mark.parametrize(("value", "promote"), [(None, 0), ("128", PROMOTE), ("64", 64)])
def test_the_switch_sets_the_interval(monkeypatch, value, promote):
    if value is None:
        monkeypatch.delenv(FP8_PROMOTE, raising=False)
    else:
        monkeypatch.setenv(FP8_PROMOTE, value)
    spec = BuildSpec.made()  # the switch read once, here
    assert spec.promote == promote and spec.fast_accumulation is (promote == 0)
    monkeypatch.setenv(FP8_PROMOTE, "32")
    assert spec.promote == promote  # a switch set later changes no spec already built


@pytest.mark.parametrize("value", ["-1", "8", "100", "fast", "1.5"])
def test_a_bad_interval_is_one_clear_line(monkeypatch, value):
    monkeypatch.setenv(FP8_PROMOTE, value)
    with pytest.raises(UserError, match=f"{FP8_PROMOTE}='{value}'"):
        BuildSpec.made()


def test_the_unfused_layer_takes_its_spec_and_the_study_record_the_switch(monkeypatch):
    """torch._scaled_mm's layer sums as its `FP8LayerSpec.promote` says, whatever the
    environment; the study's environment names the switch."""
    layer = nn.Linear(32, 16)
    spec = FP8LayerSpec(x_scale=0.1, per_channel=True, dtype=torch.float16)
    monkeypatch.delenv(FP8_PROMOTE, raising=False)
    assert FP8Matmul(layer, spec).fast_accum is True  # the default, `DEFAULT_ACCUMULATION`
    assert collect_environment(torch.device("cpu")).lab_switches is None
    monkeypatch.setenv(FP8_PROMOTE, "128")
    assert FP8Matmul(layer, spec).fast_accum is True  # no ambient setting
    assert FP8Matmul(layer, FP8LayerSpec(0.1, True, torch.float16, promote=128)).fast_accum is False
    assert collect_environment(torch.device("cpu")).lab_switches == {FP8_PROMOTE: "128"}


def test_the_fused_launch_takes_its_interval(monkeypatch):
    """Under Triton's interpreter: a tile deeper than the interval is refused at 128, whatever
    the lab switch says, and taken with all of K in the tensor cores (0, the default), its sums
    matching float32's."""
    require_triton()
    script = """
        import os, torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(0)
        xq = torch.randn(40, 512, generator=g).to(torch.float8_e4m3fn)
        w8 = torch.randn(24, 512, generator=g).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(24, generator=g) + 0.5, torch.tensor(0.5)
        args = (xq, w8, ws, xs, None, "none", torch.float32, (32, 32, 256))
        try:
            fp8_gemm_triton(*args, promote=128)
            refused = 0
        except ValueError:
            refused = 1
        os.environ["QUANTSTUDY_FP8_PROMOTE"] = "128"  # read by no launch
        y = fp8_gemm_triton(*args)
        ref = (xq.float() @ w8.float().t()) * (ws * xs)
        print(refused, ((y - ref).abs() / (ref.abs() + 1)).max().item())
    """
    monkeypatch.delenv(FP8_PROMOTE, raising=False)
    refused, err = run_interpreted(script)
    assert refused == "1"  # BLOCK_K 256 > 128 products per promotion
    assert float(err) < 1e-5  # float32 sums of exact FP8 products, in another order


def test_the_report_names_a_lab_switch():
    from pathlib import Path

    from quantstudy.record import StudyRecord
    from quantstudy.report.sections.method import _method_environment

    path = Path(__file__).parents[2] / "examples" / "tf_efficientnet_lite0-h200" / "study.json"
    record = StudyRecord.model_validate_json(path.read_text())
    assert not any("Lab switches" in line for line in _method_environment(record))
    env = record.environment.model_copy(update={"lab_switches": {FP8_PROMOTE: "0"}})
    switched = record.model_copy(update={"environment": env})
    assert any(f"{FP8_PROMOTE}=0" in line for line in _method_environment(switched))


def test_persistent_tiles_are_timed_only_with_fast_accumulation_on_deep_products():
    """`tiles.persistent_pays` through `prune_gemm`: promoting launches never see the persistent
    tiles; fast accumulation (the launch's PROMOTE 0, the default) sees them beyond one K tile."""
    require_triton()
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.quant.kernels.tiles import prune_gemm

    def kept(promote: int, k: int, m: int = 25216) -> int:
        args = {"M": m, "N": 3072, "K": k, "PROMOTE": promote}
        args |= {"tma_loads_ok": 1, "tma_store_ok": 1}
        return sum(c.kwargs["PERSISTENT"] for c in prune_gemm(FP8_GEMM.configs, args))

    assert kept(PROMOTE, 768) == 0 and kept(0, 128) == 0
    assert kept(0, 768) == 10  # five tiles, each with and without the descriptor store
    assert kept(0, 768, m=197) == 0  # batch 1's 197 tokens: under two waves of 132 for each
    # 1,024 rows: only the 64x128 tile's grid (16 x 24 programs) is two waves of 132 deep; the
    # 128x128 one (8 x 24) is not
    assert kept(0, 768, m=1024) == 2


def test_a_config_is_named_by_its_tile_paths_and_loop():
    """`tiles.config_words`, as the tuning log and `bench products` record a chosen tile."""
    require_triton()
    from quantstudy.quant.kernels.tiles import config_words, gemm_config

    assert config_words(gemm_config(128, 256, 64, 8, 3)) == "128x256x64 w8 s3"
    persistent = gemm_config(128, 256, 128, 8, 3, True, True, persistent=True, subtile=True)
    assert config_words(persistent) == "128x256x128 w8 s3 tma-loads tma-store persistent sub"
    assert config_words(gemm_config(128, 64, 32, 4, 3, per_sm=2)) == "128x64x32 w4 s3 stream2"


def test_the_spec_takes_the_option_over_the_switch_over_the_default():
    """`StudyConfig.build_spec`: `--fp8-accumulate` wins over the lab switch, which wins over
    the default (fast); the spec names the accumulation it runs (None: a lab interval)."""
    from quantstudy.record import StudyConfig
    from quantstudy.record.vocab import Accumulation

    config = StudyConfig(model="m", data="d")
    assert config.build_spec(switches={}).promote == 0
    assert config.build_spec(switches={FP8_PROMOTE: "64"}).promote == 64
    assert config.build_spec(switches={FP8_PROMOTE: "64"}).accumulation is None
    chosen = config.replace(fp8_accumulate=Accumulation.PROMOTE128)
    assert chosen.build_spec(switches={FP8_PROMOTE: "64"}).promote == PROMOTE
    assert chosen.build_spec(switches={}).accumulation == Accumulation.PROMOTE128


@pytest.mark.parametrize(
    ("option", "switch", "promote", "said"),
    [
        ("promote128", "0", PROMOTE, "promote128"),
        (None, None, 0, "fast"),
        (None, "128", PROMOTE, "promote128"),
    ],
)
def test_a_study_sums_as_its_option_says(
    tiny_imagenet, tmp_path, monkeypatch, option, switch, promote, said
):
    """Every FP8 product the study builds sums as `--fp8-accumulate` says (over the lab switch),
    else as the switch says, else fast (here the unfused layers, built from the study's spec);
    the config records what ran and the report says it."""
    import json

    import quantstudy.quant.layers.matmul as matmul
    from quantstudy.cli import main

    seen: list[int] = []
    built = matmul.FP8Matmul.__init__

    def spied(self, layer, spec) -> None:
        seen.append(spec.promote)
        built(self, layer, spec)

    monkeypatch.setattr(matmul.FP8Matmul, "__init__", spied)
    if switch is None:
        monkeypatch.delenv(FP8_PROMOTE, raising=False)
    else:
        monkeypatch.setenv(FP8_PROMOTE, switch)
    out = tmp_path / "study"
    argv = (
        "run test_efficientnet --weights random --device cpu --calib 4 --heldout 8 --no-speed "
        f"--fp8-kernel scaled_mm --data {tiny_imagenet} --out {out}"
    ).split() + (["--fp8-accumulate", option] if option else [])
    assert main(argv) == 4
    assert seen and set(seen) == {promote}
    record = json.loads((out / "study.json").read_text())
    assert record["config"]["fp8_accumulate"] == said
    assert f"| FP8 accumulation | {said} |" in (out / "report.md").read_text()


def test_a_record_without_an_accumulation_is_rebuilt_as_it_ran():
    """`StudyConfig.build_spec(recorded=True)`: a package or extension of a record before
    version 21 promotes every 128 products as its engines did; one made under the lab switch
    sums as the switch it ran under said; a record that names its accumulation is taken at its
    word."""
    from quantstudy.record import StudyConfig
    from quantstudy.record.vocab import Accumulation

    old = StudyConfig(model="resnet18", data="images")
    assert old.build_spec(switches={}, recorded=True).promote == PROMOTE
    assert old.build_spec(switches={FP8_PROMOTE: "64"}, recorded=True).promote == 64
    fast = old.replace(fp8_accumulate=Accumulation.FAST)
    assert fast.build_spec(switches={FP8_PROMOTE: "128"}, recorded=True).promote == 0
