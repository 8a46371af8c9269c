"""Weight bytes: each storage once, FP8 at one byte, wrapper subclasses through their parts."""

import torch
from torch import nn

from quantstudy.engines.size import weight_bytes


class ScaledFP8(torch.Tensor):
    """A minimal wrapper subclass in the style of FP8 weight tensors: fp8 data plus a scale."""

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, qdata.shape, dtype=torch.float32, device=qdata.device
        )

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor):
        self.qdata = qdata
        self.scale = scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ScaledFP8(inner["qdata"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"ScaledFP8 test tensor does not run {func}")


def test_plain_module_counts_every_parameter():
    m = nn.Linear(4, 3)
    assert weight_bytes(m) == (4 * 3 + 3) * 4


def test_tied_and_aliased_storages_count_once():
    m = nn.Module()
    m.a = nn.Linear(4, 4, bias=False)
    m.b = nn.Linear(4, 4, bias=False)
    m.b.weight = m.a.weight  # tied: one parameter under two names
    m.register_buffer("alias", m.a.weight.detach())  # another tensor on the same storage
    assert weight_bytes(m) == 16 * 4


def test_fp8_buffer_is_one_byte_per_element_and_fp16_two():
    m = nn.Module()
    m.register_buffer("w8", torch.zeros(10, 3, dtype=torch.float8_e4m3fn))
    m.register_buffer("w16", torch.zeros(5, dtype=torch.float16))
    assert weight_bytes(m) == 30 * 1 + 5 * 2


def test_a_view_counts_its_whole_storage():
    m = nn.Module()
    big = torch.zeros(10, dtype=torch.float16)
    m.register_buffer("head", big[:2])
    m.register_buffer("tail", big[8:])
    assert weight_bytes(m) == 10 * 2


def test_shared_parameters_fp8_buffer_together():
    m = nn.Module()
    m.conv = nn.Conv2d(3, 8, 1)  # 24 + 8 floats
    m.head = nn.Linear(8, 8)  # 64 + 8 floats
    m.head2 = nn.Linear(8, 8)
    m.head2.weight = m.head.weight  # shared weight; head2 keeps its own bias
    m.register_buffer("qweight", torch.zeros(8, 8, dtype=torch.float8_e4m3fn))
    expected = (24 + 8 + 64 + 8 + 8) * 4 + 64
    assert weight_bytes(m) == expected


def test_wrapper_subclass_is_counted_through_inner_tensors():
    m = nn.Module()
    w = ScaledFP8(torch.zeros(4, 2, dtype=torch.float8_e4m3fn), torch.ones(()))
    m.register_buffer("w", w)
    assert weight_bytes(m) == 8 * 1 + 4
