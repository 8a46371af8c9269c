"""`prepare_study`: inputs, images and the calibrated plan of a study, read once."""

import pytest
import torch

from quantstudy.record import StudyConfig
from quantstudy.record.errors import UserError
from quantstudy.study.prepare import prepare_study

torch.set_num_threads(1)


def test_prepared_study_holds_images_and_a_calibrated_plan(tiny_imagenet):
    config = StudyConfig(
        model="mobilenetv4_conv_small",
        data=tiny_imagenet,
        weights="random",
        calib=4,
        heldout=8,
        device="cpu",
        eval_batch=4,
    )
    stages = []

    def stage(name):
        stages.append(name)
        return torch.no_grad()

    p = prepare_study(config, stage)
    assert stages == ["load", "images", "calibrate"]
    assert p.calib_x.shape == (4, *p.pre.input_size) and p.heldout_x.shape[0] == 8
    assert p.labels is not None and p.labels.shape == (8,)
    assert p.layers == [d.name for d in p.inputs.recipe_info.selected] and p.layers
    assert {t.consumers[0] for t in p.calibration.tensors} <= set(p.layers)
    assert all(p.plan.calibration.scale_of(n) > 0 for n in p.layers)
    assert "BatchNorm statistics" in p.model_info.weights_detail  # random weights
    assert next(p.model.parameters()).device.type == "cpu"


def test_cuda_without_a_gpu_is_refused_before_loading(tiny_imagenet):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError, match="--device cpu"):
        prepare_study(StudyConfig(model="no_such_model", data=tiny_imagenet, device="cuda"))
