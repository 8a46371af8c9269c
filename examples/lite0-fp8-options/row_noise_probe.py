"""Where dynamic per-row activation scales would help: each FP8 layer's input rounding noise,
seen through its own fp32 weight, under the static per-tensor max scale against per-row scales.

For each of Lite0's 32 pointwise convs (`generic_pointwise`), on the first 64 images of
calib-1000: out-noise/signal = E|W (q(x) - x)|^2 / E|W x|^2 with q the FP8 fake-quant at
scale max|x| / 448 (static) or max|row| / 448 per pixel (per-row), and the share of nonzero
inputs that fall below E4M3's smallest normal under the static scale. Run from the repository
root: `.venv/bin/python examples/lite0-fp8-options/row_noise_probe.py`.
"""

import torch

from quantstudy.data.folders import scan_folder
from quantstudy.data.images import load_images
from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.quant.fp8 import E4M3_MAX, fake_quant, row_scale
from quantstudy.recipe.builtin import load_recipe
from quantstudy.recipe.resolve import resolve

torch.set_num_threads(2)
model = load_model("tf_efficientnet_lite0", "efficientnet-lite0").model.eval()
tf = build_transform(resolve_preprocessing(model))
images, _ = load_images(scan_folder("../shared/data/imagenet/calib-1000").items[:64], tf)
recipe, _ = load_recipe("generic_pointwise")
layers = resolve(recipe, model, images[:1]).selected_names
inputs: dict[str, torch.Tensor] = {}
hooks = [
    model.get_submodule(n).register_forward_pre_hook(
        lambda _m, i, n=n: inputs.__setitem__(n, i[0].detach())
    )
    for n in layers
]
with torch.no_grad():
    model(images)
for h in hooks:
    h.remove()


def through(w: torch.Tensor, t: torch.Tensor) -> float:
    return torch.einsum("oc,bchw->bohw", w, t).pow(2).mean().item()


print("layer | in channels | out-noise/signal static | per-row | per-row / static | subnormal")
ratios = []
for n in layers:
    x, w = inputs[n], model.get_submodule(n).weight.flatten(1)
    static = x.abs().amax() / E4M3_MAX
    signal = through(w, x)
    e_static = through(w, fake_quant(x, static) - x) / signal
    e_row = through(w, fake_quant(x, row_scale(x, 1)) - x) / signal
    sub = ((x.abs() < static * 2**-6) & (x != 0)).float().mean().item()
    ratios.append(e_row / e_static)
    print(f"{n} | {x.shape[1]} | {e_static:.2e} | {e_row:.2e} | {e_row / e_static:.2f} | {sub:.3f}")
ratios.sort()
print(
    f"per-row / static over {len(ratios)} layers: min {ratios[0]:.2f}, "
    f"median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}"
)
