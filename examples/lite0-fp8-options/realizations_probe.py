"""How far equally correct computations of one FP8 recipe land from fp32, image by image.

One plan (`compensating + bias correction`, headroom 4: the built-in recipe without the
sequential fit, whose plan takes seconds instead of a quarter of an hour on this CPU), its fp32
emulation computed six ways that differ only in rounding far below FP8's: fp32 sums in four
orders (NCHW or channels-last, oneDNN on or off) and the values stored in fp16 or bf16 between
layers (`engines.run.run_half_storage`). Each is scored against the fp32 model on all of
val-1300: images whose top-1 differs, and KL mean. If the counts spread over many images while
the KL means stay put, a count near a target says little about which computation is better.

Run from the repository root: `.venv/bin/python examples/lite0-fp8-options/realizations_probe.py`.
"""

from contextlib import contextmanager
from dataclasses import replace

import torch
from scipy.stats import binomtest

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.engines.builders import build_fakequant, set_numerics
from quantstudy.engines.run import run_engine, run_half_storage, run_reordered
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quality.metrics import kl_per_image
from quantstudy.quant.plan import build_plan, quant_options
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve

torch.set_num_threads(2)
set_numerics()
DATA = "../shared/data/imagenet/"
model = load_model("tf_efficientnet_lite0", "efficientnet-lite0").model.eval()
tf = build_transform(resolve_preprocessing(model))
held, _ = load_images(scan_folder(DATA + "val-1300").items, tf)
calib, _ = load_images(scan_folder(DATA + "calib-1000").items[:500], tf)
recipe, _ = load_recipe("generic_pointwise_sequential")
layers = resolve(recipe, model, held[:1]).selected_names
options = replace(quant_options(recipe), sequential=False, scale_candidates=1, refine_sweeps=0)
plan = build_plan(model, layers, lambda: (calib[i : i + 50] for i in range(0, 500, 50)),
                  held[:1], options)  # fmt: skip
with torch.no_grad():
    ref = torch.cat([model(held[i : i + 100]) for i in range(0, len(held), 100)])
fq = build_fakequant(model, torch.device("cpu"), held[:1], plan)


@contextmanager
def onednn(enabled: bool):
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


runs = {}
for on in (True, False):
    with onednn(on):
        name = "oneDNN" if on else "oneDNN off"
        runs[f"fp32, NCHW, {name}"] = run_engine(fq, held, 100)
        runs[f"fp32, channels-last, {name}"] = run_reordered(fq, held, 100)
for dtype in (torch.float16, torch.bfloat16):
    runs[f"{str(dtype).removeprefix('torch.')} storage"] = run_half_storage(fq, held, dtype, 100)

top1 = ref.argmax(1)
first = next(iter(runs.values())).argmax(1) != top1
print(f"{options}\ncomputation | differ from fp32 (of {len(held)}) | KL mean | "
      "only this one / only the first differs (sign test p)")  # fmt: skip
for name, logits in runs.items():
    differ = logits.argmax(1) != top1
    only, other = int((differ & ~first).sum()), int((first & ~differ).sum())
    p = binomtest(only, only + other).pvalue if only + other else 1.0
    kl = kl_per_image(ref, logits).mean()
    print(f"{name} | {int(differ.sum())} | {kl:.5f} | {only} / {other} ({p:.2f})")
