"""The Python API on the GPU: `quantize`'s FP8 model against the FP8 engine of a study with
the same model, recipe and calibration, both on CUDA. On the CPU the two are bit for bit
(tests/unit/test_api_study.py); on the GPU each build tunes its own tiles, so the claim is
the emulation floor: `quantize`'s model is no further from the study's FP8 engine than that
engine is from its own emulation (the fakequant engine the study scores it against), on the
same images, by the largest logit difference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

import quantstudy
from quantstudy.model.loading import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
RECIPE = "generic_default"


def _folder(root: Path, seed: int) -> Path:
    """An ImageNet-style folder of 2 classes with 8 random 64x64 JPEGs each."""
    g = torch.Generator().manual_seed(seed)
    for wnid in ("n01440764", "n01443537"):
        (root / wnid).mkdir(parents=True)
        for i in range(8):
            pixels = (torch.rand(64, 64, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(root / wnid / f"img{i}.jpg")
    return root


def test_quantize_on_the_gpu_is_within_the_emulation_floor_of_the_study_engine(tmp_path):
    config = quantstudy.StudyConfig(
        model="test_vit",
        weights="random",
        data=_folder(tmp_path / "data", seed=1),
        calib_data=_folder(tmp_path / "calib", seed=2),
        calib=6,
        heldout=12,
        device="cuda",
        batches=(1, 2),
        speed=False,
        recipe=RECIPE,
        out=tmp_path / "study",
    )
    study = quantstudy.run_study(config)
    model = load_model("test_vit", "random", seed=config.seed).model
    fp8, _ = quantstudy.quantize(
        model, RECIPE, calibration=config.calib_data, calib=config.calib, device="cuda"
    )
    engine = quantstudy.load_engine(study.folder)
    emulation = quantstudy.load_engine(study.folder, "fakequant")
    images = torch.randn(5, 3, 160, 160, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = fp8(images).float()
        theirs = engine(images).float()
        floor = (theirs - emulation(images).float()).abs().max()
    assert (ours - theirs).abs().max() <= floor
