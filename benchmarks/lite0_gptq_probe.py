"""Would error-compensating FP8 weight rounding (GPTQ-style) cut Lite0's weight-only error? (CPU)

A probe, not a feature: the BN-folded fp32 model with the recipe's 1x1 conv weights replaced by
their FP8 values, rounded two ways, activations left in fp32, scored against the fp32 model on
every held-out image:
- nearest: each weight to its nearest FP8 value on the per-channel scale (what engines do);
- compensating: columns rounded one at a time, each one's error pushed onto the columns not
  yet rounded through the inverse of the layer's input second moment E[x x^T] (calibration
  pixels, every 7th), the GPTQ procedure with per-channel FP8 in place of an integer grid.
Neither applies bias correction; `lite0_error_split.py` gives the bias-corrected figure.

    python benchmarks/lite0_gptq_probe.py --data ../shared/data/imagenet/val-1300 \
        --calib ../shared/data/imagenet/calib-1000 --out /tmp/gptq.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from lite0_error_split import lite0_inputs
from torch import nn

from quantstudy.quality.metrics import kl_per_image
from quantstudy.quant.fold import fold_batchnorm
from quantstudy.quant.fp8 import E4M3, E4M3_MAX, dequantize_weight, quantize_weight
from quantstudy.record.io import write_json_atomic


def second_moments(model: nn.Module, layers: list[str], images: torch.Tensor) -> dict:
    """E[x x^T] of each layer's input channels over every 7th calibration pixel, float64."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(module, args, name):
        x = args[0].detach().permute(0, 2, 3, 1).reshape(-1, args[0].shape[1])[::7].double()
        sums[name] = sums.get(name, 0) + x.t() @ x
        counts[name] = counts.get(name, 0) + x.shape[0]

    handles = [
        model.get_submodule(n).register_forward_pre_hook(lambda m, a, n=n: hook(m, a, n))
        for n in layers
    ]
    with torch.no_grad():
        for i in range(0, len(images), 50):
            model(images[i : i + 50])
    for h in handles:
        h.remove()
    return {n: sums[n] / counts[n] for n in layers}


def compensated(weight: torch.Tensor, moment: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """FP8 values of `weight` (N, K) on its per-channel scale, rounded column by column with
    each column's error spread over the later ones (GPTQ's update, float64)."""
    w = weight.double().clone()
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / E4M3_MAX)[:, None]
    h = moment + damp * moment.diagonal().mean() * torch.eye(len(moment), dtype=moment.dtype)
    upper = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.empty_like(w)
    for j in range(w.shape[1]):
        q[:, j] = ((w[:, j : j + 1] / scale).clamp(-E4M3_MAX, E4M3_MAX).float().to(E4M3).double()
                   * scale)[:, 0]  # fmt: skip
        err = (w[:, j] - q[:, j]) / upper[j, j]
        w[:, j + 1 :] -= err[:, None] * upper[j, j + 1 :][None, :]
    return q.float()


def with_weights(model: nn.Module, layers: list[str], rounding: str, moments: dict) -> nn.Module:
    out = copy.deepcopy(model)
    for name in layers:
        conv = out.get_submodule(name)
        w = conv.weight.detach().float().reshape(conv.weight.shape[0], -1)
        if rounding == "nearest":
            w8, scale = quantize_weight(w, True)
            q = dequantize_weight(w8, scale, torch.float32)
        else:
            q = compensated(w, moments[name])
        with torch.no_grad():
            conv.weight.copy_(q.reshape(conv.weight.shape))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--calib", type=Path, required=True)
    p.add_argument("--n-calib", type=int, default=500)
    p.add_argument("--recipe", default="generic_pointwise")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    model, val, cal, _, source, layers = lite0_inputs(args)
    fold_batchnorm(model, val[:1])
    moments = second_moments(model, layers, cal)
    rows = []
    with torch.no_grad():
        ref = torch.cat([model(val[i : i + 100]) for i in range(0, len(val), 100)])
        for rounding in ("nearest", "compensating"):
            m = with_weights(model, layers, rounding, moments)
            out = torch.cat([m(val[i : i + 100]) for i in range(0, len(val), 100)])
            differ = int((out.argmax(1) != ref.argmax(1)).sum())
            kl = float(kl_per_image(ref, out).mean())
            rows.append({"rounding": rounding, "differ": differ, "kl_mean": kl})
            print(f"{rounding}: {differ} of {len(val)} images differ, KL mean {kl:.4f}", flush=True)
    write_json_atomic(args.out, {"recipe": source, "layers": layers, "rows": rows})


if __name__ == "__main__":
    main()
