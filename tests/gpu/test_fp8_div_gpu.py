"""The FP8 write's division on the GPU (`quant/kernels/epilogue.py: scaled_down`): the scale's
reciprocal with one Markstein correction gives IEEE division's float32 quotient for every fp16
input, and its E4M3 byte for float32 ones, so the fused engines still write the unfused engine's
bits. The kernel that compares them is the lab check's (`tools/lab/gpu/fp8_div_check.py`, which
runs it over 4,134 scales for the record); here over 102."""

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
CHECK = Path(__file__).resolve().parents[2] / "tools" / "lab" / "gpu" / "fp8_div_check.py"


def test_the_corrected_reciprocal_divides_as_ieee_division():
    spec = importlib.util.spec_from_file_location("fp8_div_check", CHECK)
    assert spec is not None and spec.loader is not None
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    scales, halves, floats = lab.inputs(64, seed=1, n_floats=1 << 20)
    assert lab.check(halves, scales) == (0, 0)
    assert lab.check(floats, scales)[1] == 0  # the bytes; a few float32 quotients may differ
