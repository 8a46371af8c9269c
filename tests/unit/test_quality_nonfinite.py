"""NaN/Inf scan: a NaN made inside a real module is found, named by engine and image id."""

import pytest
import torch
from torch import nn

from quantstudy.quality.metrics import build_quality_section, score_engine
from quantstudy.quality.nonfinite import finite_rows, scan_nonfinite

torch.set_num_threads(1)


class NaNGate(nn.Module):
    """Passes its input through, except rows whose first feature is negative become NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.0 * torch.sqrt(x[:, :1])


class TinyNet(nn.Module):
    def __init__(self, gate: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = NaNGate() if gate else nn.Identity()
        self.fc = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.gate(x))


def batch() -> tuple[torch.Tensor, list[str]]:
    x = torch.rand(5, 4, generator=torch.Generator().manual_seed(1)) + 0.1
    x[3, 0] = -1.0  # only this image trips the gate
    return x, [f"val/n0144/img_{i:04d}.JPEG" for i in range(5)]


def test_nan_from_one_layer_is_named_by_engine_and_image():
    x, ids = batch()
    with torch.no_grad():
        ref, eng = TinyNet(gate=False)(x), TinyNet(gate=True)(x)
    assert torch.isnan(eng[3]).all() and torch.isfinite(eng[[0, 1, 2, 4]]).all()
    stress = torch.zeros(3, 6)
    stress[2, 1] = float("inf")
    scan = scan_nonfinite("fp8", eng, ids, stress, ["pixel/black", "pixel/white", "pre/beyond_pos"])
    assert scan.engine == "fp8"
    assert scan.nonfinite_heldout == ["val/n0144/img_0003.JPEG"]
    assert scan.nonfinite_stress == ["pre/beyond_pos"]
    assert (scan.heldout_checked, scan.stress_checked) == (5, 3)

    q = score_engine("fp8", ref, eng, None)
    assert q.kl_mean == 0.0 and q.differ_count == 1  # the four finite rows are identical
    section = build_quality_section("fp32", [q], [scan], ["a"], None, None, False)
    warning = next(w for w in section.warnings if "NaN/Inf" in w)
    assert warning.startswith("fp8:") and "img_0003" in warning


def test_clean_engine_scans_clean():
    x, ids = batch()
    with torch.no_grad():
        ref = TinyNet(gate=False)(x)
    scan = scan_nonfinite("fp16", ref, ids, torch.zeros(2, 6), ["a", "b"])
    assert scan.nonfinite_heldout == [] and scan.nonfinite_stress == []
    assert finite_rows(ref).all()


def test_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="names"):
        scan_nonfinite("fp8", torch.zeros(2, 3), ["a"], torch.zeros(0, 3), [])
