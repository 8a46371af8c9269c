"""Where EfficientNet-Lite0's FP8 error comes from: weights, activations, or both (CPU).

The recipe emulated in fp32 (`build_fakequant`) three ways, each scored against the fp32 model
on every held-out image: FP8 weights only, FP8 activations only, both. Calibration and scoring
are the study's own code; no GPU. Prints one table and writes JSON.

    python benchmarks/lite0_error_split.py --data ../shared/data/imagenet/val-1300 \
        --calib ../shared/data/imagenet/calib-1000 --out /tmp/split.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.engines.builders import build_fakequant
from quantstudy.engines.run import run_engine
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quality.metrics import kl_per_image
from quantstudy.quant.apply import QuantPlan
from quantstudy.quant.calibrate import calibrate
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record.io import write_json_atomic

MODES = {"weights only": (True, False), "activations only": (False, True), "both": (True, True)}


def lite0_inputs(args: argparse.Namespace) -> tuple:
    """Lite0 with its real weights (fp32, eval), the held-out and calibration images, the
    recipe, its source and its selected layers; two CPU threads."""
    torch.set_num_threads(2)
    model = load_model("tf_efficientnet_lite0", "efficientnet-lite0").model.eval()
    tf = build_transform(resolve_preprocessing(model))
    val, _ = load_images(scan_folder(args.data).items, tf, desc="held-out")
    cal, _ = load_images(scan_folder(args.calib).items[: args.n_calib], tf, desc="calibration")
    recipe, source = load_recipe(args.recipe)
    layers = [d.name for d in resolve(recipe, model, val[:1]).selected]
    return model, val, cal, recipe, source, layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="held-out images (ImageNet folder)")
    p.add_argument("--calib", type=Path, required=True, help="calibration images")
    p.add_argument("--n-calib", type=int, default=500)
    p.add_argument("--recipe", default="generic_pointwise_bc")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cpu = torch.device("cpu")
    model, val, cal, recipe, source, layers = lite0_inputs(args)
    a = recipe.activations
    calibration = calibrate(
        model, layers, (cal[i : i + 50] for i in range(0, len(cal), 50)), a.calibrator, a.params
    )
    per_channel = recipe.weights.granularity == "per_channel"
    plan = QuantPlan(layers, per_channel, calibration, recipe.weights.bias_correction)
    rows = []
    with torch.no_grad():
        fp32 = build_fakequant(model, cpu, val[:1], plan, weights=False, activations=False)
        ref = run_engine(fp32, val, 100)
        for mode, (w, act) in MODES.items():
            t0 = time.perf_counter()
            engine = build_fakequant(model, cpu, val[:1], plan, weights=w, activations=act)
            out = run_engine(engine, val, 100)
            differ = int((out.argmax(1) != ref.argmax(1)).sum())
            rows.append(
                {
                    "quantized": mode,
                    "agreement": 1 - differ / len(val),
                    "differ": differ,
                    "kl_mean": float(kl_per_image(ref, out).mean()),
                    "seconds": time.perf_counter() - t0,
                }
            )
    print("quantized | agreement | images that differ | KL mean")
    for r in rows:
        print(f"{r['quantized']} | {r['agreement']:.4f} | {r['differ']} | {r['kl_mean']:.4f}")
    write_json_atomic(
        args.out,
        {"recipe": source, "layers": len(layers), "n_images": len(val), "rows": rows},
    )


if __name__ == "__main__":
    main()
