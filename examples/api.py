"""quantstudy from Python, on the CPU in about a minute: the FP8 model of a timm classifier, a
study of it, and the study's FP8 engine loaded back.

    python examples/api.py [FOLDER]

Everything it writes goes into FOLDER (default ./api-example): the study, and the demo's
images where the shared ImageNet subsets are absent (the 20 images of the foolbox wheel, as
`quantstudy demo` takes them). The model is timm's tiny `test_vit` with random weights, so the
quality numbers mean nothing and the decision is inconclusive: it shows the calls, not a
verdict. CI runs it (tests/unit/test_api_example.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import timm
import torch

import quantstudy
from quantstudy.data.demo import demo_data


def main(folder: Path) -> quantstudy.Study:
    images = demo_data(cache_dir=folder)  # the shared subsets, else the foolbox images
    model = timm.create_model("test_vit")  # random weights: no download

    # 1. The FP8 model, calibrated on the first images of a folder (as a study calibrates).
    fp8, plan = quantstudy.quantize(
        model, calibration=images.calib_dir or images.data_dir, calib=8, device="cpu"
    )
    batch = torch.randn(2, 3, 160, 160)
    print("FP8 logits:", tuple(fp8(batch).shape))
    print("FP8 layers:", len(plan.engine.fp8_real), "first:", plan.table()[0][:3])

    # 2. A study of the same model and recipe, then its FP8 engine rebuilt from the record.
    config = quantstudy.StudyConfig(
        model="test_vit",
        weights="random",
        data=images.data_dir,
        calib_data=images.calib_dir,
        class_list=images.class_list,
        calib=8,
        heldout=12,
        device="cpu",
        speed=False,  # CPU timings are no FP8 evidence
        out=folder / "study",
    )
    study = quantstudy.run_study(config)
    engine = quantstudy.load_engine(study.folder)
    print("study engine logits:", tuple(engine(batch).shape))
    assert study.decision is not None
    print("decision:", study.decision.outcome, "| figures:", ", ".join(study.figures()))
    return study


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("api-example"))
