"""The epilogue probe's products (`bench/epilogue_shapes.py`) and its refusal on a machine
without CUDA: one clear line, before any file is written (`tools/lab/bench/epilogue.py` asks
`need_cuda` first)."""

import itertools

import pytest
import torch

from quantstudy.bench.epilogue_shapes import EPILOGUE_PROGRAM, SHAPES
from quantstudy.bench.provenance import need_cuda
from quantstudy.record.errors import UserError

NO_GPU = "checks the refusal on a machine without CUDA"


@pytest.mark.skipif(torch.cuda.is_available(), reason=NO_GPU)
def test_without_a_gpu_it_refuses_in_one_line():
    with pytest.raises(UserError, match=r"epilogue\.py needs a CUDA GPU"):
        need_cuda(EPILOGUE_PROGRAM)


def test_the_shapes_are_res2net_block_ends_at_batch_128():
    # each stage halves the map and doubles the channels: M falls 4x, N and K grow 2x
    for (_, m0, n0, k0), (_, m1, n1, k1) in itertools.pairwise(SHAPES):
        assert (m0 // m1, n1 // n0, k1 // k0) == (4, 2, 2)
    assert SHAPES[0][1:] == (128 * 56 * 56, 256, 104)
