"""Recipe quality options on CPU: compensating rounding through the engines, dynamic per-row
activation scales, per-layer calibrators, scale migration and its exactness, bad values."""

import pytest
import torch
from _interpreter import require_triton, run_interpreted
from _option_nets import LAYERS, images, pointwise_net

from quantstudy.engines.builders import build_fakequant, build_fp8
from quantstudy.engines.run import run_engine
from quantstudy.quant.fitting.migrate import exact_divisors, smooth_divisors, with_migration
from quantstudy.quant.formats.fp8 import row_scale
from quantstudy.quant.plan.build import build_plan
from quantstudy.recipe.options import quant_options
from quantstudy.recipe.resolve import resolve
from quantstudy.recipe.schema import parse_recipe
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.errors import UserError
from quantstudy.record.quant_options import QuantOptions

CPU = torch.device("cpu")
_net, _data = pointwise_net, images


def _plan(**options):
    x = _data()
    return build_plan(_net(), LAYERS, lambda: [x[:12], x[12:]], x[:1], QuantOptions(**options))


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).pow(2).mean())


@pytest.mark.parametrize("bias_correction", [False, True])
def test_compensating_rounding_reaches_every_engine_alike(bias_correction):
    """The FP8 engines (fp32 compute, both kernels) and the emulation store the same weights,
    so with compensating rounding they agree as closely as with nearest rounding."""
    net, x = _net(), _data()
    plan = _plan(rounding="compensating", bias_correction=bias_correction)
    assert set(plan.calibration.second_moment) == set(LAYERS)
    fq = run_engine(build_fakequant(net, CPU, x[:1], plan), x)
    for kernel in ("fused", "scaled_mm"):
        engine = build_fp8(
            net, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel=kernel)
        )
        out = run_engine(engine, x)
        assert torch.allclose(out, fq, rtol=1e-4, atol=1e-4), kernel


def test_compensating_rounding_cuts_the_weight_error():
    net, x = _net(), _data()
    with torch.no_grad():
        ref = net(x)
    errors = {}
    for rounding in ("nearest", "compensating"):
        plan = _plan(rounding=rounding)
        engine = build_fakequant(net, CPU, x[:1], plan, activations=False)
        errors[rounding] = _err(run_engine(engine, x), ref)
    assert errors["compensating"] < errors["nearest"]


def test_row_scales_quantize_each_pixel_on_its_own_scale():
    x = torch.randn(5, 7)
    x[2] = 0
    s = row_scale(x)
    assert s.shape == (5, 1) and float(s[2]) == 1.0
    assert torch.allclose(s[0, 0], x[0].abs().max() / 448)
    net, data = _net(), _data()
    plan = _plan(row_scales=True)
    fq = run_engine(build_fakequant(net, CPU, data[:1], plan), data)
    for kernel in ("fused", "scaled_mm"):
        out = run_engine(
            build_fp8(net, CPU, data[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel=kernel)),
            data,
        )
        assert torch.allclose(out, fq, rtol=1e-4, atol=1e-4), kernel


def test_triton_kernel_row_scales_under_the_interpreter():
    require_triton()
    (worst,) = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(0)
        worst = 0.0
        for m, k, n in [(70, 48, 40), (5, 16, 16)]:
            xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
            w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
            ws, b = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
            xs = torch.rand(m, 1, generator=g) + 0.1
            ref = (xq.float() @ w8.float().t()) * (ws * xs) + b
            for stream in (0, 1):
                tile = (32, 64, 64) if stream else (32, 32, 32)
                y = fp8_gemm_triton(xq, w8, ws, xs, b, "none", torch.float32, tile, stream=stream)
                worst = max(worst, ((y - ref).abs() / (ref.abs() + 1)).max().item())
        print(worst)
        """
    )
    assert float(worst) < 1e-5


def test_row_scales_limited_to_narrow_inputs():
    """per_row_max_channels: per-row scales where the input has at most that many channels
    (layers 3 and 9 read 32, layer 6 reads 48), static scales and FP8 hand-offs elsewhere."""
    net, data = _net(), _data()
    plan = _plan(row_scales=True, row_max_channels=32)
    rows = {n: plan.per_row(net.get_submodule(n)) for n in LAYERS}
    assert rows == {"3": True, "6": False, "9": True}
    assert plan.static_input("6", net.get_submodule("6"))
    assert not plan.static_input("3", net.get_submodule("3"))
    fq = run_engine(build_fakequant(net, CPU, data[:1], plan), data)
    engine = build_fp8(
        net, CPU, data[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")
    )
    assert [engine.eager.get_submodule(n).row_scales for n in LAYERS] == [True, False, True]
    assert torch.allclose(run_engine(engine, data), fq, rtol=1e-4, atol=1e-4)
    everywhere = _plan(row_scales=True)
    assert all(everywhere.per_row(net.get_submodule(n)) for n in LAYERS)


def test_triton_kernel_quantizes_rows_in_its_prologue_under_the_interpreter():
    """An fp16 input is quantized in the kernel with per-row scales (after the divisor) as
    `quantize_rows` does: with an identity weight each output is one FP8 value times its row
    scale. K spans several tiles (two passes over K) and one tile (streaming programs); a
    padded weight's extra columns are not read. Triton 3.6's interpreter casts float32 to FP8
    inexactly (ties away from even, a carry into the next power of two a binade down,
    subnormals truncated), so here each value must be within one FP8 step of the reference
    and nearly all equal; the GPU test compares every bit
    (tests/gpu/test_row_prologue_gpu.py::test_prologue_quantized_values_are_exact)."""
    require_triton()
    equal, far = run_interpreted(
        """
        import torch
        from quantstudy.quant.formats.fp8 import quantize_rows
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        from tests.fp8_steps import within_one_e4m3_step
        g = torch.Generator().manual_seed(0)
        equal, total, far = 0, 0, 0
        for m, k, tile, stream in [(70, 40, (32, 64, 16), 0), (40, 24, (32, 32, 32), 1)]:
            x = (torch.randn(m, k, generator=g) * 5).half()
            x[3] = 0  # an all-zero row: scale 1
            x[5, 7] = 3e4  # one large value: the rest of its row is subnormal or zero
            d = 1 / (torch.rand(k, generator=g) + 0.5)  # a reciprocal divisor
            w8 = torch.zeros(k, k + 8).to(torch.float8_e4m3fn)  # 8 padded columns
            w8[:, :k] = torch.eye(k).to(torch.float8_e4m3fn)
            ws, xs = torch.ones(k), torch.ones(())
            for div in (None, d):
                q, s = quantize_rows(x, div)
                y = fp8_gemm_triton(
                    x, w8, ws, xs, None, "none", torch.float32, tile, stream=stream,
                    x_inv_divisor=div,
                )
                r = q.float()
                got = (y / s).to(torch.float8_e4m3fn).float()  # y / s: an E4M3 value, rounded
                carried = (r.abs().log2() % 1 == 0) & (got == r / 2)  # the carry bug
                far += int((~within_one_e4m3_step(got, r)).logical_and(~carried).sum())
                equal += int((y == r * s).sum())
                total += r.numel()
        print(equal / total, far)
        """
    )
    assert float(equal) > 0.97 and int(far) == 0


def test_per_layer_calibrator_overrides_the_tensor_it_reads():
    base = _plan()
    mixed = _plan(layer_calibrators={"6": "percentile"})
    assert mixed.calibration.tensor_calibrator == {"6": "percentile"}
    assert mixed.calibration.amax["6"] < base.calibration.amax["6"]
    assert mixed.calibration.amax["3"] == base.calibration.amax["3"]
    info = mixed.calibration.info()
    assert [t.calibrator for t in info.tensors] == [None, "percentile", None]
    with pytest.raises(UserError, match="not selected"):
        _plan(layer_calibrators={"0": "mse"})


def test_migration_keeps_the_float_model_and_calibrates_divided_inputs():
    net, x = _net(), _data()
    plan = _plan(migration="smooth", migration_alpha=0.5)
    assert set(plan.divisors) == set(LAYERS)
    folded = _net()
    from quantstudy.quant.rewrites.fold import fold_batchnorm

    fold_batchnorm(folded, x[:1])
    with torch.no_grad():
        same = with_migration(folded, plan.divisors)(x)
        assert torch.allclose(same, folded(x), rtol=1e-4, atol=1e-4)
    # the migrated input's amax is that of x / d (max calibrator: exact)
    amax = plan.calibration.channel_amax["6"] / plan.divisors["6"]
    assert plan.calibration.amax["6"] == pytest.approx(float(amax.max()), rel=1e-6)
    fq = run_engine(build_fakequant(net, CPU, x[:1], plan), x)
    out = run_engine(
        build_fp8(net, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel="fused")), x
    )
    assert torch.allclose(out, fq, rtol=1e-4, atol=1e-4)


def test_migration_that_changes_the_float_model_is_dropped():
    net, x = _net(), _data()
    plan = _plan(migration="smooth")
    bad = dict(plan.divisors)
    bad["6"] = torch.full_like(bad["6"], float("inf"))  # x / inf = 0: not the same model
    kept = exact_divisors(net, x[:1], bad)
    assert "6" not in kept and set(kept) == {"3", "9"}
    assert smooth_divisors(net, ["3"], plan.calibration, 0.5).keys() == {"3"}


RECIPE = """
name: t
weights: {rounding: %s}
activations: {granularity: %s, migration: %s, migration_alpha: %s, layer_calibrators: %s}
rules:
  - include: {op: conv2d}
"""


@pytest.mark.parametrize(
    "values, message",
    [
        (("stochastic", "per_tensor", "none", 0.5, "{}"), "weights.rounding"),
        (("nearest", "per_pixel", "none", 0.5, "{}"), "activations.granularity"),
        (("nearest", "per_tensor", "awq", 0.5, "{}"), "activations.migration"),
        (("nearest", "per_tensor", "smooth", 1.5, "{}"), "activations.migration_alpha"),
        (("nearest", "per_tensor", "none", 0.5, "{a: minmax}"), "activations.layer_calibrators"),
    ],
)
def test_bad_option_values_are_one_clear_line(values, message):
    with pytest.raises(UserError) as err:
        parse_recipe((RECIPE % values).encode(), "r.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith("r.yaml line") and message in text


def test_a_row_width_limit_without_row_scales_is_one_clear_line():
    text = RECIPE % ("nearest", "per_tensor", "none", 0.5, "{}")
    text = text.replace(
        "granularity: per_tensor,", "granularity: per_tensor, per_row_max_channels: 64,"
    )
    with pytest.raises(UserError, match="needs granularity: per_row") as err:
        parse_recipe(text.encode(), "r.yaml")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="per_row_max_channels"):
        parse_recipe(text.replace("64", "0").replace("per_tensor", "per_row").encode(), "r.yaml")
    ok = parse_recipe(text.replace("per_tensor", "per_row").encode(), "r.yaml")
    assert ok.activations.per_row_max_channels == 64


@pytest.mark.parametrize(
    "weights, message",
    [
        ("{rounding: nearest, scale_candidates: 16}", "set rounding: compensating"),
        ("{rounding: nearest, refine_sweeps: 4}", "set rounding: compensating"),
        ("{rounding: compensating, scale_candidates: 0}", "weights.scale_candidates"),
        ("{rounding: compensating, scale_candidates: 65}", "weights.scale_candidates"),
        ("{rounding: compensating, refine_sweeps: -1}", "weights.refine_sweeps"),
        ("{rounding: compensating, refine_sweeps: many}", "weights.refine_sweeps"),
    ],
)
def test_bad_rounding_searches_are_one_clear_line(weights, message):
    text = (RECIPE % ("compensating", "per_tensor", "none", 0.5, "{}")).replace(
        "{rounding: compensating}", weights
    )
    with pytest.raises(UserError, match=message) as err:
        parse_recipe(text.encode(), "r.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("r.yaml line")


def test_rounding_searches_reach_the_plan_and_the_record():
    searched = "{rounding: compensating, scale_candidates: 8, refine_sweeps: 2}"
    text = (RECIPE % ("compensating", "per_tensor", "none", 0.5, "{}")).replace(
        "{rounding: compensating}", searched
    )
    recipe = parse_recipe(text.encode(), "r.yaml")
    options = quant_options(recipe)
    assert (options.scale_candidates, options.refine_sweeps) == (8, 2)
    info = resolve(recipe, _net(), _data()[:1]).to_info(recipe, "r.yaml")
    assert (info.scale_candidates, info.refine_sweeps) == (8, 2)
    default = quant_options(parse_recipe(b"name: d\nrules:\n  - include: {op: conv2d}\n", "d"))
    assert (default.scale_candidates, default.refine_sweeps) == (1, 0)


def test_rounding_searches_reach_every_engine_alike_and_cut_the_weight_error():
    """The searched weights and scales are stored once and every engine reads them: the FP8
    engines agree with the emulation as closely as without the searches."""
    net, x = _net(), _data()
    with torch.no_grad():
        ref = net(x)
    plan = _plan(rounding="compensating", scale_candidates=8, refine_sweeps=3)
    fq = run_engine(build_fakequant(net, CPU, x[:1], plan), x)
    for kernel in ("fused", "scaled_mm"):
        engine = build_fp8(
            net, CPU, x[:1], plan, dtype=torch.float32, spec=BuildSpec(kernel=kernel)
        )
        assert torch.allclose(run_engine(engine, x), fq, rtol=1e-4, atol=1e-4), kernel
    errors = {}
    for name, p in (("plain", _plan(rounding="compensating")), ("searched", plan)):
        engine = build_fakequant(net, CPU, x[:1], p, activations=False)
        errors[name] = _err(run_engine(engine, x), ref)
    assert errors["searched"] < errors["plain"]


def test_options_parse_and_default():
    r = parse_recipe(
        (RECIPE % ("compensating", "per_row", "smooth", 0.3, "{a: mse}")).encode(), "r"
    )
    assert r.weights.rounding == "compensating" and r.activations.granularity == "per_row"
    assert r.activations.layer_calibrators == {"a": "mse"}
    d = parse_recipe(b"name: d\nrules:\n  - include: {op: conv2d}\n", "d")
    assert d.weights.rounding == "nearest" and d.activations.migration == "none"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--heldout", "0"], "--heldout"),
        (["--variants", "nearest", "no such variant"], "no option variant 'no such variant'"),
    ],
)
def test_bench_options_refuses_bad_input_in_one_line_before_loading_anything(
    args, message, tmp_path, capsys
):
    from quantstudy.cli import main

    out = tmp_path / "options.json"
    status = main(["bench", "options", "tf_efficientnet_lite0", "--data", str(tmp_path),
                   "--device", "cpu", *args, "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 1 and message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_options_table_pairs_each_variant_with_the_first():
    """`score` keeps per-image KL and differing images; `paired` turns two scores of the same
    images into the change of KL mean and of the differing count, with intervals."""
    from quantstudy.bench.options.scores import paired, score

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(200, 10, generator=g)
    labels = ref.argmax(1).numpy()
    near = ref + 0.3 * torch.randn(200, 10, generator=g)
    far = ref + 0.6 * torch.randn(200, 10, generator=g)
    a, b = score(ref, near, labels), score(ref, far, labels)
    assert len(a["per_image"]["kl"]) == 200 and len(a["per_image"]["differ"]) == a["differ"]
    c = paired(a, b)
    assert c["differ_change"] == b["differ"] - a["differ"] > 0
    assert c["kl_mean_change"] == pytest.approx(b["kl_mean"] - a["kl_mean"], rel=1e-4)
    assert 0 < c["kl_low"] < c["kl_mean_change"] < c["kl_high"]
    assert c["differ_low"] <= c["differ_change"] <= c["differ_high"]
    assert paired(a, a)["kl_mean_change"] == 0 and paired(a, a)["differ_high"] == 0


def test_headroom_multiplies_every_static_amax_and_spares_larger_inputs():
    """Headroom h: each recorded amax (the clip value) is h x the calibrator's; an input twice
    as large as any calibration image then no longer saturates, so the emulation tracks fp32
    more closely on it."""
    net, x = _net(), _data()
    plain, roomy = _plan(), _plan(headroom=4.0)
    assert roomy.calibration.amax == {k: 4.0 * v for k, v in plain.calibration.amax.items()}
    with torch.no_grad():
        ref = net(3 * x)
    errors = {
        h: _err(run_engine(build_fakequant(net, CPU, x[:1], p), 3 * x), ref)
        for h, p in ((1, plain), (4, roomy))
    }
    assert errors[4] < errors[1]


@pytest.mark.parametrize("value", ["0.5", "300", "none"])
def test_a_bad_headroom_is_one_clear_line(value):
    text = (RECIPE % ("nearest", "per_tensor", "none", 0.5, "{}")).replace(
        "granularity: per_tensor,", f"granularity: per_tensor, headroom: {value},"
    )
    with pytest.raises(UserError, match=r"activations\.headroom") as err:
        parse_recipe(text.encode(), "r.yaml")
    assert "\n" not in str(err.value)
    ok = parse_recipe(text.replace(f"headroom: {value}", "headroom: 4").encode(), "r.yaml")
    assert quant_options(ok).headroom == 4.0
    assert resolve(ok, _net(), _data()[:1]).to_info(ok, "r.yaml").headroom == 4.0


def test_bench_options_scores_the_engine_in_other_dtypes(tiny_imagenet, tmp_path):
    """`--engine-dtypes float32`: the engine variant's FP8 engine of the same plan, also built
    in float32, gets its own rows against fp32 and against the emulation; in float32 the engine
    computes the emulation's arithmetic up to summation order. `--storage-dtypes`: the
    emulation stored in each half dtype, bf16 (8 significant bits) further from it than fp16.
    The images are the study's split of one folder: 4 to calibrate, the other 8 held out."""
    import json

    from quantstudy.cli import main

    torch.set_num_threads(2)
    out = tmp_path / "options.json"
    data = str(tiny_imagenet)
    assert main(["bench", "options", "test_efficientnet", "--weights", "random", "--data", data,
                 "--calib", "4", "--heldout", "8", "--device", "cpu", "--variants", "nearest",
                 "--engine-variants", "nearest", "--engine-dtypes", "float32",
                 "--storage-dtypes", "float16", "bfloat16", "--threads", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert (result["n_calib"], result["n_heldout"]) == (4, 8)
    assert result["provenance"]["command"].startswith("quantstudy bench options")
    (row,) = result["rows"]
    assert {"fp8", "fp8_float32", "fp8_float32_vs_fakequant"} <= set(row)
    # the emulation stored in each half dtype, against the emulation and against fp32
    for dtype in ("float16", "bfloat16"):
        assert row[f"floor_{dtype}"]["n"] == row[f"fakequant_{dtype}"]["n"] == 8
    assert row["floor_bfloat16"]["kl_mean"] > row["floor_float16"]["kl_mean"] > 0
    assert row["fakequant_reordered"]["n"] == 8  # the floor's run, against fp32
    assert row["fp8_float32"]["n"] == row["fp8"]["n"] == 8
    assert row["fp8_float32_vs_fakequant"]["kl_mean"] < 1e-6


def test_bench_options_refuses_a_storage_dtype_that_is_not_half(tmp_path, capsys):
    """`--storage-dtypes` takes the half dtypes only: float32 storage is the emulation itself."""
    from quantstudy.cli import main

    with pytest.raises(SystemExit) as err:
        main(["bench", "options", "m", "--data", str(tmp_path), "--storage-dtypes", "float32",
              "--out", str(tmp_path / "o.json")])  # fmt: skip
    assert err.value.code == 2
    assert "--storage-dtypes: invalid choice: 'float32'" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_the_gelu_requirement_reaches_the_plan_and_the_record():
    """A recipe's `gelu: erf` is read into the options, the plan and the record's recipe; the
    search writing its options back keeps it."""
    from quantstudy.recipe.options import with_quant_options
    from quantstudy.record.vocab import GeluPolicy

    text = "gelu: erf\n" + RECIPE % ("nearest", "per_tensor", "none", 0.5, "{}")
    recipe = parse_recipe(text.encode(), "r.yaml")
    options = quant_options(recipe)
    assert options.gelu == GeluPolicy.ERF
    assert with_quant_options(recipe, options).gelu == GeluPolicy.ERF
    assert _plan(gelu="erf").gelu == GeluPolicy.ERF
    assert resolve(recipe, _net(), _data()[:1]).to_info(recipe, "r.yaml").gelu == "erf"
    default = parse_recipe(b"name: d\nrules:\n  - include: {op: conv2d}\n", "d")
    assert quant_options(default).gelu == GeluPolicy.ANY
