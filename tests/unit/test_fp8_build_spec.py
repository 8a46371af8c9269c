"""The FP8 build spec (`BuildSpec`, `KernelChoice`, `StudyConfig.build_spec`), the keys of the
caches of measured things, and the engine's layout section (`FP8Layout`), as read from records
written before schema 18."""

import json

import pytest
from pydantic import ValidationError

from quantstudy.env.switches import FP8_PROMOTE, GEMM_CONFIGS, TUNE_SCREEN
from quantstudy.record import EngineInfo, FP8Layout, KernelChoice, LayerKernel, StudyConfig
from quantstudy.record.build_spec import BuildSpec
from quantstudy.record.vocab import FASTEST

# rows of a kernel choice as schema 17 to 23 wrote them, one timing field per kernel
SCHEMA_17_ROWS = [
    {"name": "a", "kernel": "fp16", "fused_us": 10.0, "fp16_us": 5.0, "batch": 1},
    {"name": "b", "kernel": "scaled_mm", "fused_us": 10.0, "scaled_mm_us": 4.0, "batch": 1},
]
ROW_US = [{"fused": 10.0, "fp16": 5.0}, {"fused": 10.0, "scaled_mm": 4.0}]
ROWS = [LayerKernel.model_validate(r) for r in SCHEMA_17_ROWS]
# an FP8 engine as schema 17 wrote it: the layout flat, "fastest" as its kernel
SCHEMA_17 = {
    "name": "fp8", "compute_dtype": "float16", "device": "cuda", "compiled": True,
    "fp8_real": ["b"], "fp8_emulated": [], "fp8_kernel": "fastest",
    "fp8_epilogue": {"b": "relu"}, "fp8_kernel_choice": SCHEMA_17_ROWS,
    "fp8_stepped_aside": ["a"], "fp16_layers": 3, "weight_bytes": 1, "numerics": {},
}  # fmt: skip


def test_a_choice_is_timed_or_replayed_never_both():
    assert KernelChoice.timed([128, 1, 128]).batches == (1, 128)
    assert KernelChoice.replayed(ROWS).replay == tuple(ROWS)
    with pytest.raises(ValidationError, match="timed at some batches or replays"):
        KernelChoice()
    with pytest.raises(ValidationError, match="timed at some batches or replays"):
        KernelChoice(batches=(1,), replay=tuple(ROWS))


def test_the_option_fastest_builds_the_fused_engine_with_a_choice_per_layer():
    fastest = StudyConfig(model="m", data="d", fp8_kernel="fastest", batches=(32, 1))
    spec = fastest.build_spec(switches={})
    assert spec.kernel == "fastest" and spec.choice == KernelChoice.timed([1, 32])
    assert spec.backend == "fused"  # the choice swaps other modules in where they win
    recorded = KernelChoice.replayed(ROWS)
    assert fastest.build_spec(recorded).choice == recorded  # rebuilt as recorded, not timed
    plain = StudyConfig(model="m", data="d")
    assert plain.fp8_kernel is None and plain.build_spec(recorded).choice is None
    assert plain.build_spec().backend == "fused"
    scaled = plain.replace(fp8_kernel="scaled_mm").build_spec()
    assert scaled.kernel == scaled.backend == "scaled_mm"
    with pytest.raises(ValidationError, match="kernel choice goes with"):
        BuildSpec(kernel="fused", choice=KernelChoice.timed([1]))
    with pytest.raises(ValidationError, match="kernel choice goes with"):
        BuildSpec(kernel="fastest")


def test_a_spec_is_frozen_and_reads_the_switches_once(monkeypatch):
    monkeypatch.setenv(FP8_PROMOTE, "128")
    spec = BuildSpec.made("fused")
    assert spec.switches == ((FP8_PROMOTE, "128"),) and spec.promote == 128
    monkeypatch.setenv(FP8_PROMOTE, "0")
    assert spec.promote == 128  # read once, when built
    with pytest.raises(ValidationError, match="frozen"):
        spec.promote = 0
    assert BuildSpec(switches={"B": "1", "A": "2"}) == BuildSpec(switches=[("A", "2"), ("B", "1")])


# Specs that differ in one thing each: the kernel, the choice, the accumulation, a lab switch
# and each rewrite.
DIFFERENT = [
    BuildSpec(),
    BuildSpec(kernel="scaled_mm"),
    BuildSpec(kernel="fastest", choice=KernelChoice.timed([1])),
    BuildSpec(kernel="fastest", choice=KernelChoice.timed([1, 128])),
    BuildSpec(kernel="fastest", choice=KernelChoice.replayed(ROWS)),
    BuildSpec(promote=128),
    BuildSpec(promote=64),
    BuildSpec(switches={GEMM_CONFIGS: "4"}),
    BuildSpec(switches={TUNE_SCREEN: "0"}),
    BuildSpec(residual=False),
    BuildSpec(sum_handoff=True),
    BuildSpec(pad_outputs=False),
]


def test_two_specs_never_share_a_key():
    keys = [spec.key() for spec in DIFFERENT]
    assert len(set(keys)) == len(DIFFERENT)
    assert BuildSpec().key() == BuildSpec.made(switches={}).key()  # the same spec, the same key


def test_two_specs_never_share_a_kernel_choice_timing(tmp_path, monkeypatch):
    """The kernel choice's timing cache (`engines/kernel_choice.py`): a layer timed under one
    spec is timed again under another, and read back under the same one; before, the key left
    the accumulation out, so a promoting engine took a fast one's timings."""
    import torch
    from torch import nn

    from quantstudy.engines import kernel_choice
    from quantstudy.engines.builders import build_fp8
    from quantstudy.quant.calibration.calibrate import calibrate
    from quantstudy.quant.plan.apply import QuantPlan

    model = nn.Sequential(nn.Conv2d(8, 32, 1), nn.ReLU(), nn.Conv2d(32, 16, 1)).eval()
    x = torch.randn(4, 8, 4, 4)
    plan = QuantPlan(["0", "2"], True, calibrate(model, ["0", "2"], [x]))
    timed: list[str] = []

    def clock(fn) -> float:
        timed.append("t")
        return 1.0

    monkeypatch.setattr(kernel_choice, "cache_path", lambda: tmp_path / "choice.json")
    monkeypatch.setattr(kernel_choice, "_versions", lambda device: "cpu")
    choice = KernelChoice.timed([2])
    counts, specs = [], [BuildSpec(kernel="fastest", choice=choice, promote=p) for p in (0, 128)]
    for spec in specs + specs:
        before = len(timed)
        cpu = torch.device("cpu")
        build_fp8(model, cpu, x[:1], plan, dtype=torch.float32, spec=spec, timer=clock)
        counts.append(len(timed) - before)
    assert counts[0] > 0 and counts[1] > 0  # each spec timed its layers
    assert counts[2] == counts[3] == 0  # and read its own entries back
    stored = json.loads((tmp_path / "choice.json").read_text())
    assert {json.loads(key)[-1] for key in stored} == {spec.key() for spec in specs}


def test_a_schema_17_engine_reads_as_its_layout_and_writes_flat():
    info = EngineInfo.model_validate(SCHEMA_17)
    layout = info.layout
    assert layout.kernel == "fused" and layout.kernel_option == FASTEST
    assert layout.stepped_aside == ["a"] and layout.epilogue == {"b": "relu"}
    assert layout.replay() == KernelChoice.replayed(ROWS)
    written = json.loads(info.model_dump_json())
    assert "layout" not in written and written["fp8_kernel"] == "fused"  # no kernel "fastest"
    # the kernel choice's rows as schema 24 writes them: their timings by backend name
    rows = [{k: v for k, v in r.items() if not k.endswith("_us")} for r in SCHEMA_17_ROWS]
    rows = [r | {"us": us} for r, us in zip(rows, ROW_US, strict=True)]
    assert written["fp8_kernel_choice"] == [r | {"why": None} for r in rows]
    same = set(SCHEMA_17) - {"fp8_kernel", "fp8_kernel_choice"}
    assert {k: written[k] for k in same} == {k: SCHEMA_17[k] for k in same}
    assert all(k.startswith("fp8_") for k in set(written) - set(SCHEMA_17) - {"compile_mode",
               "cuda_graphs", "channels_last"})  # fmt: skip
    # as a schema 17 record's file, given only the keys it had, and nothing else changed
    dumped = info.model_dump(mode="json", exclude_unset=True)
    assert dumped == {**SCHEMA_17, "fp8_kernel": "fused", "fp8_kernel_choice": rows}
    assert EngineInfo.model_validate(written) == info  # the round trip holds


def test_an_engine_without_fp8_has_an_empty_layout_and_updates_name_fields_flat():
    fp16 = EngineInfo(
        name="fp16", compute_dtype="float16", device="cuda", compiled=True, fp8_real=[],
        fp8_emulated=[], fp16_layers=3, weight_bytes=1, numerics={},
    )  # fmt: skip
    assert (
        fp16.layout == FP8Layout()
        and fp16.layout.kernel_option is None
        and not fp16.layout.replay()
    )
    copied = fp16.model_copy(update={"fp8_kernel": "scaled_mm", "name": "fp8"})
    assert copied.layout.kernel == "scaled_mm" and copied.name == "fp8"
    with pytest.raises(ValidationError, match="kernel choice ran fp16"):
        EngineInfo.model_validate({**SCHEMA_17, "fp8_stepped_aside": []})
