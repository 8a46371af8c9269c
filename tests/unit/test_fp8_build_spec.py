"""The FP8 build spec (`KernelChoice`, `StudyConfig.fp8_build`) and the engine's layout section
(`FP8Layout`), as read from records written before schema 18."""

import json

import pytest
from pydantic import ValidationError

from quantstudy.record import EngineInfo, FP8Layout, KernelChoice, LayerKernel
from quantstudy.record.engines import built_kernel, fp8_build
from quantstudy.record.inputs import StudyConfig
from quantstudy.record.vocab import FP8Kernel, KernelOption

ROWS = [
    LayerKernel(name="a", kernel="fp16", fused_us=10.0, fp16_us=5.0, batch=1),
    LayerKernel(name="b", kernel="scaled_mm", fused_us=10.0, scaled_mm_us=4.0, batch=1),
]
# an FP8 engine as schema 17 wrote it: the layout flat, "fastest" as its kernel
SCHEMA_17 = {
    "name": "fp8", "compute_dtype": "float16", "device": "cuda", "compiled": True,
    "fp8_real": ["b"], "fp8_emulated": [], "fp8_kernel": "fastest",
    "fp8_epilogue": {"b": "relu"}, "fp8_kernel_choice": [r.model_dump(mode="json") for r in ROWS],
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
    assert fp8_build(KernelOption.FASTEST, [32, 1]) == KernelChoice.timed([1, 32])
    assert fp8_build("scaled_mm", [1]) == FP8Kernel.SCALED_MM
    assert built_kernel(KernelChoice.timed([1])) == FP8Kernel.FUSED
    assert built_kernel(FP8Kernel.SCALED_MM) == FP8Kernel.SCALED_MM
    fastest = StudyConfig(model="m", data="d", fp8_kernel="fastest", batches=(1, 32))
    assert fastest.fp8_build() == KernelChoice.timed([1, 32])
    recorded = KernelChoice.replayed(ROWS)
    assert fastest.fp8_build(recorded) == recorded  # a recorded choice is rebuilt, not timed
    plain = StudyConfig(model="m", data="d")
    assert plain.fp8_kernel is None and plain.fp8_build(recorded) == FP8Kernel.FUSED


def test_a_schema_17_engine_reads_as_its_layout_and_writes_flat():
    info = EngineInfo.model_validate(SCHEMA_17)
    layout = info.layout
    assert layout.kernel == FP8Kernel.FUSED and layout.kernel_option == KernelOption.FASTEST
    assert layout.stepped_aside == ["a"] and layout.epilogue == {"b": "relu"}
    assert layout.replay() == KernelChoice.replayed(ROWS)
    written = json.loads(info.model_dump_json())
    assert "layout" not in written and written["fp8_kernel"] == "fused"  # no kernel "fastest"
    assert {k: written[k] for k in SCHEMA_17 if k != "fp8_kernel"} == {
        k: v for k, v in SCHEMA_17.items() if k != "fp8_kernel"
    }
    assert all(k.startswith("fp8_") for k in set(written) - set(SCHEMA_17) - {"compile_mode",
               "cuda_graphs", "channels_last"})  # fmt: skip
    # as a schema 17 record's file, given only the keys it had, and nothing else changed
    assert info.model_dump(mode="json", exclude_unset=True) == {**SCHEMA_17, "fp8_kernel": "fused"}
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
    copied = fp16.model_copy(update={"fp8_kernel": FP8Kernel.SCALED_MM, "name": "fp8"})
    assert copied.layout.kernel == FP8Kernel.SCALED_MM and copied.name == "fp8"
    with pytest.raises(ValidationError, match="kernel choice ran fp16"):
        EngineInfo.model_validate({**SCHEMA_17, "fp8_stepped_aside": []})
