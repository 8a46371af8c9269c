"""Per-layer kernel choice on CUDA: timed in place, replayed from its record to the same bits, and,
where every FP8 layer keeps the fused kernel, the fused engine's bits with the same layers kept
in fp16 (docs/fp8-kernel.md, "The per-layer kernel choice"). A mixed choice (a layer on
torch._scaled_mm) computes other numbers: its structure is checked here, its equality is a
strict xfail of the withdrawn claim.

Timing decides the choice, so each case that needs one rewrites the stored timings to force it
and builds again (the build reads them from `fp8_kernel_choice.json` beside Inductor's cache)."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from quantstudy.engines.builders import build_fp8
from quantstudy.engines.unfused import Unfused
from quantstudy.quant.calibration.calibrate import calibrate
from quantstudy.quant.plan.apply import QuantPlan
from quantstudy.record import KernelChoice
from quantstudy.record.build_spec import BuildSpec

pytestmark = pytest.mark.gpu


class _Net(nn.Module):
    """A thin 1x1 conv (where the fused kernel won on the H200) and a wide linear (where
    cuBLASLt did), neither handing FP8 over."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(32, 96, 1)
        self.act = nn.ReLU6()
        self.fc = nn.Linear(96, 1536)

    def forward(self, x):
        z = self.act(self.pw(x))
        return self.fc((z + z.mean((2, 3), keepdim=True)).mean((2, 3)))


class _Setup:
    """The model, its plan, the fused engine and the input of every case, built once per
    Inductor cache folder."""

    def __init__(self, cache: Path) -> None:
        torch.manual_seed(0)
        self.model = _Net().eval()
        x = torch.randn(8, 32, 28, 28)
        self.plan = QuantPlan(["pw", "fc"], True, calibrate(self.model, ["pw", "fc"], [x]))
        self.example = x[:1]
        self.xin = x.cuda().half().contiguous(memory_format=torch.channels_last)
        self.cache = cache

    def build(self, kernel):
        """The engine of `kernel`: a backend's name, or a `KernelChoice` ("fastest")."""
        spec = BuildSpec.made(kernel, switches={})
        return build_fp8(self.model, torch.device("cuda"), self.example, self.plan, spec=spec)

    def forced(self, timings: Callable[[bool], dict[str, float]]):
        """The fastest engine built from stored timings rewritten by `timings(is_conv)`."""
        self.build(KernelChoice.timed([64]))  # stores the measured timings
        path = self.cache / "fp8_kernel_choice.json"
        stored = json.loads(path.read_text())
        # the input shape of each key: NCHW for pw, (N, C) for fc
        stored = {key: timings(len(json.loads(key)[1]) == 4) for key in stored}
        path.write_text(json.dumps(stored))
        return self.build(KernelChoice.timed([64]))

    def logits(self, engine) -> torch.Tensor:
        with torch.no_grad():
            return engine.eager(self.xin).float()


@pytest.fixture
def setup(tmp_path, monkeypatch) -> _Setup:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return _Setup(tmp_path)


def _kernels(engine) -> dict[str, str]:
    return {c.name: str(c.kernel) for c in engine.info().layout.kernel_choice}


def test_fastest_engine_times_every_layer_and_its_replay_computes_its_bits(setup, tmp_path):
    """Whatever timing chose, `quantstudy extend`'s replay of the recorded choice (nothing
    timed) builds the engine that computes the timed one's logits bit for bit."""
    fastest = setup.build(KernelChoice.timed([64]))
    choice = fastest.info().layout.kernel_choice
    assert [c.name for c in choice] == ["pw", "fc"]
    # timed (the shared input quantize subtracted, so a tiny product may read 0)
    assert all(c.fused_us >= 0 and c.scaled_mm_us >= 0 and c.batch == 64 for c in choice)
    assert all(c.fp16_us > 0 for c in choice)  # the float layer, which has no quantize to subtract
    assert (tmp_path / "fp8_kernel_choice.json").is_file()
    replayed = setup.build(KernelChoice.replayed(list(choice)))
    assert _kernels(replayed) == _kernels(fastest)
    a, b = setup.logits(fastest), setup.logits(replayed)
    assert torch.equal(a, b), (a - b).abs().max()


def test_a_choice_of_the_fused_kernel_everywhere_computes_the_fused_engines_bits(setup):
    """Both layers keep the fused kernel (timings rewritten): the choice's screen, assembly and
    replay change no number, the fastest engine is the fused one bit for bit."""
    fastest = setup.forced(lambda conv: {"fused": 1.0, "scaled_mm": 100.0, "fp16": 1000.0})
    assert _kernels(fastest) == {"pw": "fused", "fc": "fused"}
    assert fastest.info().layout.stepped_aside == []
    fused = setup.build("fused")
    a, b = setup.logits(fused), setup.logits(fastest)
    assert torch.equal(a, b), (a - b).abs().max()


def _mixed_timings(conv: bool) -> dict[str, float]:
    """The 1x1 conv keeps the fused kernel, the linear takes torch._scaled_mm, fp16 loses."""
    fused_us, mm_us = (1.0, 100.0) if conv else (100.0, 1.0)
    return {"fused": fused_us, "scaled_mm": mm_us, "fp16": 1000.0}


def test_a_mixed_choice_runs_both_kernels(setup):
    """Timing decides the mix, so the stored timings are rewritten to force one: the engine
    built from them holds both kinds of layer."""
    mixed = setup.forced(_mixed_timings)
    assert _kernels(mixed) == {"pw": "fused", "fc": "scaled_mm"}
    layers = dict(mixed.eager.named_modules())
    assert isinstance(layers["fc"], Unfused) and not isinstance(layers["pw"], Unfused)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="measured on the H200 (tests/gpu/records/gpu-suite-7d58091.json): the mixed engine "
    "moved 0.0002 of the outputs by at most 2.4e-4, so 'changes no number' is withdrawn "
    "(docs/fp8-kernel.md); strict, so the day it holds this fails and is noticed",
)
def test_a_mixed_choice_changes_no_number(setup):
    """The mixed engine of `test_a_mixed_choice_runs_both_kernels` against the fused engine:
    only the equality is expected to fail."""
    mixed = setup.forced(_mixed_timings)
    a, b = setup.logits(setup.build("fused")), setup.logits(mixed)
    assert torch.equal(a, b), f"{(a != b).float().mean():.4f} differ, worst {(a - b).abs().max()}"


def test_a_layer_where_cublaslt_wins_runs_its_epilogue_made_from_the_fused_layer(setup):
    """The stored timings are rewritten so that cuBLASLt beats every other kernel on the linear
    (the 1x1 conv's ReLU6 has no cuBLASLt epilogue: it keeps the fused kernel): the linear runs
    cuBLASLt's layer made from the fused one, its bias in cuBLASLt's epilogue and no op after
    it, and the replay of the recorded choice computes its bits."""
    from quantstudy.quant.cublaslt.library import unavailable
    from quantstudy.quant.layers.lt_matmul import LtFP8Matmul

    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    fastest = setup.forced(
        lambda conv: {"fused": 1.0 if conv else 100.0, "cublaslt": 100.0 if conv else 1.0,
                      "scaled_mm": 50.0, "fp16": 1000.0}
    )  # fmt: skip
    assert _kernels(fastest) == {"pw": "fused", "fc": "cublaslt"}
    fc = fastest.eager.fc
    assert type(fc) is LtFP8Matmul and fc.lt_plan()[0] is not None
    replayed = setup.build(KernelChoice.replayed(list(fastest.info().layout.kernel_choice)))
    a, b = setup.logits(fastest), setup.logits(replayed)
    assert torch.equal(a, b), (a - b).abs().max()


def test_a_layer_whose_float_layer_wins_steps_aside_on_cuda(setup):
    """The stored timings are rewritten so that the linear's float layer beats both FP8 kernels:
    the rebuilt engine runs it as an fp16 `nn.Linear` (cuBLAS) with the 1x1 conv still FP8 on
    the fused kernel, and computes what the fused engine with that layer stepped aside
    computes, bit for bit."""
    fastest = setup.forced(
        lambda conv: {"fused": 10.0, "scaled_mm": 20.0, "fp16": 100.0 if conv else 1.0}
    )
    info = fastest.info()
    assert info.layout.stepped_aside == ["fc"] and info.fp8_real == ["pw"]
    assert _kernels(fastest) == {"pw": "fused", "fc": "fp16"}
    fc = fastest.eager.fc
    assert isinstance(fc, Unfused) and type(fc.layer) is nn.Linear
    assert fc.layer.weight.dtype == torch.float16
    kept = [c for c in info.layout.kernel_choice if c.kernel == "fp16"]  # fc's, alone
    reference = setup.build(KernelChoice.replayed(kept))
    a, b = setup.logits(reference), setup.logits(fastest)
    assert torch.equal(a, b), (a - b).abs().max()
