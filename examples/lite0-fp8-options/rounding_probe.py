"""What compensating rounding's searches buy on each layer's own objective: the output error
(w - q) H (w - q)^T over the output power w H w^T, with H the fp32 second moment of the layer's
input, for nearest, compensating, compensating with refinement sweeps, with scale candidates,
and with both (`quant/rounding.py`, `round_weight`).

For each of Lite0's 32 pointwise convs (`generic_pointwise`, BatchNorm folded), on the first 64
images of calib-1000. Run from the repository root:
`.venv/bin/python examples/lite0-fp8-options/rounding_probe.py` (about a minute on 2 cores).
"""

import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quant.fold import fold_batchnorm
from quantstudy.quant.fp8 import dequantize_weight
from quantstudy.quant.rounding import SEARCHED, Search, output_error, round_weight
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve

torch.set_num_threads(2)
model = load_model("tf_efficientnet_lite0", "efficientnet-lite0").model.eval()
tf = build_transform(resolve_preprocessing(model))
images, _ = load_images(scan_folder("../shared/data/imagenet/calib-1000").items[:64], tf)
recipe, _ = load_recipe("generic_pointwise")
layers = resolve(recipe, model, images[:1]).selected_names
fold_batchnorm(model, images[:1])
sums: dict[str, torch.Tensor] = {}
counts: dict[str, int] = {}


def collect(name: str):
    def hook(_m, inp):
        x = inp[0].detach().movedim(1, -1).reshape(-1, inp[0].shape[1]).double()
        sums[name] = sums.get(name, 0) + x.t() @ x
        counts[name] = counts.get(name, 0) + x.shape[0]

    return hook


hooks = [model.get_submodule(n).register_forward_pre_hook(collect(n)) for n in layers]
with torch.no_grad():
    for start in range(0, len(images), 16):
        model(images[start : start + 16])
for h in hooks:
    h.remove()

ways = {
    "nearest": None,
    "compensating": Search(),
    f"+{SEARCHED.sweeps} sweeps": Search(sweeps=SEARCHED.sweeps),
    f"+{SEARCHED.scales} scales": Search(scales=SEARCHED.scales),
    "+both": SEARCHED,
}
totals = dict.fromkeys(ways, 0.0)
print(f"{'layer':24} {'K':>5} " + " ".join(f"{w:>13}" for w in ways))
for name in layers:
    w = (
        model.get_submodule(name)
        .weight.detach()
        .reshape(model.get_submodule(name).weight.shape[0], -1)
    )
    h = sums[name] / counts[name]
    power = float(((w.double() @ h) * w.double()).sum())
    row = []
    for way, search in ways.items():
        w8, scale = round_weight(w, True, None if search is None else h, search or Search())
        q = dequantize_weight(w8, scale, torch.float32)
        ratio = float(output_error(w, q, h).sum()) / power
        totals[way] += ratio / len(layers)
        row.append(ratio)
    print(f"{name:24} {w.shape[1]:5d} " + " ".join(f"{r:13.2e}" for r in row))
print(f"{'mean over layers':30} " + " ".join(f"{totals[w]:13.2e}" for w in ways))
