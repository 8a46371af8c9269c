"""The Python API on the GPU: `quantize`'s FP8 model against the FP8 engine of a study with
the same model, recipe and calibration, both on CUDA. On the CPU the two are bit for bit
(tests/unit/test_api_study.py); on the GPU each build tunes its own tiles, so the claim is
the emulation floor: `quantize`'s model is no further from the study's FP8 engine than that
engine is from its own emulation (the fakequant engine the study scores it against), on the
same images, by the largest logit difference."""

from __future__ import annotations

import pytest
import torch

import quantstudy
from quantstudy.model.loading import load_model
from tests.api_study import RECIPE, api_study_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def test_quantize_on_the_gpu_is_within_the_emulation_floor_of_the_study_engine(tmp_path):
    config = api_study_config(tmp_path, "cuda", per_class=8, size=64)
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
