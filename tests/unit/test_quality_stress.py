"""Stress inputs: deterministic, complete against the documented table, right shapes and ranges."""

import re

import pytest
import torch

from quantstudy.quality import stress
from quantstudy.quality.stress import STRESS_INPUTS, stress_inputs
from quantstudy.record import Preprocessing

torch.set_num_threads(1)

H, W = 40, 48  # non-square, so a swapped height and width shows


def preprocessing(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> Preprocessing:
    return Preprocessing(
        input_size=(3, H, W),
        crop_pct=0.875,
        crop_mode="center",
        interpolation="bicubic",
        mean=mean,
        std=std,
        settings="test",
        source="test",
    )


def documented_names() -> list[str]:
    return re.findall(r"^\| ((?:pixel|pre)/\S+) \|", stress.__doc__, flags=re.MULTILINE)


def as_dict(pre: Preprocessing | None = None) -> dict[str, torch.Tensor]:
    return dict(stress_inputs(pre or preprocessing()))


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(1)
    a = stress_inputs(preprocessing())
    torch.manual_seed(2)
    torch.rand(10)
    b = stress_inputs(preprocessing())
    assert [n for n, _ in a] == [n for n, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True))


def test_complete_against_documented_table():
    names = [n for n, _ in stress_inputs(preprocessing())]
    assert names == documented_names()
    assert len(names) == len(set(names)) == 29
    for required in (
        "pixel/black", "pixel/white", "pixel/red", "pixel/green", "pixel/blue",
        "pixel/checker_p1", "pixel/checker_p2", "pixel/checker_p8", "pixel/checker_p32",
        "pixel/impulse_center", "pixel/impulse_corner", "pixel/hgrad", "pixel/vgrad",
        "pre/gauss_s3", "pre/range_alt", "pre/beyond_pos", "pre/beyond_neg",
    ):  # fmt: skip
        assert required in names


def test_shapes_dtype_finite():
    for name, x in stress_inputs(preprocessing()):
        assert x.shape == (3, H, W), name
        assert x.dtype == torch.float32, name
        assert torch.isfinite(x).all(), name


def test_pixel_inputs_map_back_into_unit_range():
    mean = torch.tensor(preprocessing().mean).view(3, 1, 1)
    std = torch.tensor(preprocessing().std).view(3, 1, 1)
    for name, x in as_dict().items():
        if name.startswith("pixel/"):
            pixels = x * std + mean
            assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6, name


def test_known_values():
    pre = preprocessing()
    mean, std = torch.tensor(pre.mean).view(3, 1, 1), torch.tensor(pre.std).view(3, 1, 1)
    lo, hi = (0 - mean) / std, (1 - mean) / std
    x = as_dict(pre)
    assert torch.allclose(x["pixel/black"], lo.expand(3, H, W))
    assert torch.allclose(x["pixel/white"], hi.expand(3, H, W))
    red = x["pixel/red"] * std + mean
    assert torch.allclose(red[0], torch.ones(H, W), atol=1e-6)
    assert torch.allclose(red[1:], torch.zeros(2, H, W), atol=1e-6)
    impulse = x["pixel/impulse_center"] * std + mean
    assert int((impulse > 0.5).sum()) == 3 and impulse[:, H // 2, W // 2].min() > 0.99
    assert (x["pixel/impulse_corner"] * std + mean)[:, 0, 0].min() > 0.99
    checker = x["pixel/checker_p8"][0]
    assert checker[0, 0] == checker[0, 7] == checker[7, 7] != checker[0, 8]
    assert checker[0, 8] != checker[8, 8]
    p1 = x["pixel/checker_p1"][0]
    assert p1[0, 0] != p1[0, 1] and p1[0, 0] == p1[1, 1]
    hgrad = x["pixel/hgrad"] * std + mean
    assert hgrad[:, :, 0].abs().max() < 1e-6 and (hgrad[:, :, -1] - 1).abs().max() < 1e-6
    assert torch.allclose(hgrad[:, 0], hgrad[:, -1])  # constant down each column
    vgrad = x["pixel/vgrad"] * std + mean
    assert (vgrad[:, -1, :] - 1).abs().max() < 1e-6 and torch.allclose(
        vgrad[:, :, 0], vgrad[:, :, -1]
    )


def test_preprocessed_space_inputs():
    pre = preprocessing()
    lo = [(0 - m) / s for m, s in zip(pre.mean, pre.std, strict=True)]
    hi = [(1 - m) / s for m, s in zip(pre.mean, pre.std, strict=True)]
    bound = 3 * max(abs(v) for v in lo + hi)
    x = as_dict(pre)
    assert torch.allclose(x["pre/beyond_pos"], torch.full((3, H, W), bound))
    assert torch.allclose(x["pre/beyond_neg"], torch.full((3, H, W), -bound))
    assert x["pre/beyond_alt"].max() == pytest.approx(bound) and x[
        "pre/beyond_alt"
    ].min() == pytest.approx(-bound)
    assert x["pre/uniform_beyond"].abs().max() <= bound + 1e-4
    assert x["pre/uniform_beyond"].abs().max() > max(abs(v) for v in lo + hi)  # really beyond
    alt = x["pre/range_alt"]
    for c in range(3):
        assert sorted(alt[c].unique().tolist()) == pytest.approx(sorted({lo[c], hi[c]}), rel=1e-6)
    assert alt[0, 0, 0] == pytest.approx(hi[0]) and alt[1, 0, 0] == pytest.approx(lo[1])
    assert x["pre/gauss_s3"].std() == pytest.approx(3.0, rel=0.05)
    assert x["pre/gauss_s10"].std() == pytest.approx(10.0, rel=0.05)
    assert not torch.equal(x["pre/gauss_s1"] * 3, x["pre/gauss_s3"])  # separate seeds


def test_pixel_inputs_follow_the_normalisation():
    a = as_dict(preprocessing())
    b = as_dict(preprocessing(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)))
    assert torch.allclose(b["pixel/black"], torch.full((3, H, W), -1.0))
    assert not torch.allclose(a["pixel/black"], b["pixel/black"])


def test_rejects_non_rgb_input_size():
    pre = preprocessing().model_copy(update={"input_size": (1, H, W)})
    with pytest.raises(ValueError, match="3-channel"):
        stress_inputs(pre)


def test_registry_matches_spaces_in_names():
    assert all(item.name.split("/")[0] == item.space for item in STRESS_INPUTS)
