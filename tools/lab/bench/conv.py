"""Every dense kxk conv a model's recipe selects, alone: cuDNN in fp16 against the FP8
implicit-GEMM kernel (`quant/kernels/conv.py`), with the roofline of each.

    python tools/lab/bench/conv.py --model res2net50_26w_4s --batch 128 --out conv.json

Per distinct conv shape at `batch` (random weights and inputs: only shapes matter; bias, no
activation, as res2net's 3x3 convs run): the eager fp16 conv on a channels-last map (cuDNN,
benchmark mode), the FP8 layer's product on an FP8 channels-last input with its channels
zero-padded to a multiple of 16 as `FusedFP8Conv2d` pads them (autotuned tile), and the same
unpadded (pixel rows of 26 or 52 bytes), each replayed from a CUDA graph (median); the FP8
roofline (`speed.ideal`) beside. Prints one table and writes JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from torch import nn

from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import resolve_preprocessing
from quantstudy.quant.formats.fp8 import quantize_weight, to_fp8
from quantstudy.quant.kernels.conv import tap_major
from quantstudy.quant.layers.fused_conv import fp8_conv2d, kxk_fp8_blocker
from quantstudy.recipe.builtin import default_recipe_for, load_recipe
from quantstudy.recipe.resolve import resolve
from quantstudy.record.io import write_json_atomic
from quantstudy.record.vocab import Activation
from quantstudy.speed.ideal import layer_cost, peaks_for


def _us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")


def bench(model_name: str, batch: int) -> list[dict]:
    loaded = load_model(model_name, "random")
    pre = resolve_preprocessing(loaded.model)
    example = torch.zeros(1, 3, *pre.input_size[-2:])
    recipe, _ = load_recipe(default_recipe_for(model_name))
    selected = resolve(recipe, loaded.model, example).to_info(recipe, "").selected
    peaks = peaks_for(torch.cuda.get_device_name())
    seen, rows = set(), []
    for d in selected:
        layer = loaded.model.get_submodule(d.name)
        if not isinstance(layer, nn.Conv2d) or layer.kernel_size == (1, 1):
            continue
        if kxk_fp8_blocker(layer) is not None:
            continue
        key = (d.in_channels, d.out_channels, d.input_hw, layer.kernel_size, layer.stride)
        if key in seen:
            continue
        seen.add(key)
        rows.append(_one(layer, d, batch, peaks))
        print(" | ".join(str(v) for v in rows[-1].values()), flush=True)
    return rows


def _one(layer: nn.Conv2d, d, batch: int, peaks, device: str = "cuda") -> dict:
    h, w = d.input_hw
    cuda = torch.device(device)
    x16 = torch.randn(batch, d.in_channels, h, w, device=cuda).half()
    x16 = x16.contiguous(memory_format=torch.channels_last)
    conv = nn.Conv2d(
        d.in_channels, d.out_channels, layer.kernel_size, layer.stride, layer.padding,
        layer.dilation,
    )  # fmt: skip
    w8, w_scale = quantize_weight(conv.weight.detach().float(), True)
    x_scale, bias = torch.tensor(0.02, device=cuda), conv.bias.detach().to(cuda)
    w_scale = w_scale.to(cuda)
    geometry = [list(layer.stride), list(layer.padding), list(layer.dilation)]
    conv16 = conv.to(cuda, torch.float16).to(memory_format=torch.channels_last)

    def fp8_us(pad: int) -> float:
        """The product on an FP8 channels-last input with `pad` zero channels added."""
        xq = to_fp8(F.pad(x16, (0, 0, 0, 0, 0, pad)), x_scale)
        xq = xq.contiguous(memory_format=torch.channels_last)
        taps = tap_major(F.pad(w8.float(), (0, 0, 0, 0, 0, pad)).to(w8.dtype)).to(cuda)
        args = (xq, taps, list(layer.kernel_size), w_scale, x_scale, bias, Activation.NONE)
        return _us(lambda: fp8_conv2d(*args, torch.float16, *geometry, None, torch.float16))

    pad = -d.in_channels % 16
    with torch.no_grad():
        fp16_us = _us(lambda: conv16(x16))
        padded_us = fp8_us(pad)  # what the FP8 layer runs (`FusedFP8Conv2d.c_pad`)
        unpadded_us = fp8_us(0) if pad else None
    cost = layer_cost(d, batch)
    return {
        "conv": f"{d.in_channels}->{d.out_channels} {h}x{w} k{layer.kernel_size[0]} "
        f"s{layer.stride[0]}",
        "M": cost.m,
        "K": cost.k,
        "N": cost.n,
        "fp16_cudnn_us": round(fp16_us, 2),
        "fp8_us": round(padded_us, 2),
        "fp8_unpadded_us": round(unpadded_us, 2) if unpadded_us is not None else None,
        "fp8_roofline_us": round(cost.fp8_us(peaks), 2) if peaks else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="tools/lab/bench/conv.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="res2net50_26w_4s")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    print("conv | M | K | N | fp16 cuDNN us | FP8 us (channels padded) | unpadded us | roofline us")
    rows = bench(args.model, args.batch)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__}  # fmt: skip
    write_json_atomic(args.out, {"environment": env, "model": args.model, "batch": args.batch,
                                 "convs": rows})  # fmt: skip


if __name__ == "__main__":
    main()
