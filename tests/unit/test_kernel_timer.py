"""The kernel timer (`gpu/timer.py`) on the CPU: what each caller asks of Triton's CUDA-graph
bench (its `rep` and statistic, an eager call first or not), with the bench stood in; and the
fixed-tile launches `bench products --sweep` adds (`bench/tile_sweep.py`)."""

from __future__ import annotations

import pytest
import torch
from _interpreter import require_triton


@pytest.fixture
def graph_bench(monkeypatch):
    """Triton's `do_bench_cudagraph` stood in: each call's `rep` and `return_mode` are kept, and
    it answers 0.25 ms; `torch.cuda.synchronize` does nothing (no GPU here)."""
    require_triton()
    import triton.testing

    asked: list[tuple[float, str]] = []

    def bench(fn, rep=20, grad_to_none=None, quantiles=None, return_mode="mean"):
        fn()
        asked.append((rep, return_mode))
        return 0.25

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return asked


def test_the_timer_takes_each_callers_rep_and_statistic(graph_bench):
    from quantstudy.bench.lt_probe import probe_us
    from quantstudy.gpu.timer import time_ms, time_us
    from quantstudy.quant.kernels import search

    calls = []

    def fn():
        calls.append(1)

    assert time_ms(fn, rep=50, stat="mean") == 0.25 and len(calls) == 1
    assert time_us(fn, rep=20, stat="mean", eager=True) == 250.0 and len(calls) == 3
    assert search.screen_time(fn) == search.full_time(fn) == 0.25
    assert probe_us(fn) == 250.0
    assert graph_bench == [(50, "mean"), (20, "mean"), (1, "median"), (5, "median"), (20, "median")]


def test_the_sweep_launches_every_tile_on_each_path_the_product_allows():
    """Off the GPU (no interpreter) an operand takes no descriptor, so loads go through
    pointers; the output of N 64 in fp16 has 16-byte rows, so both stores are tried; the
    streaming tiles that hold K 32 and N 64 join them."""
    require_triton()
    from quantstudy.bench.tile_sweep import sweep_launches
    from quantstudy.quant.kernels.tiles import TILES

    a8 = torch.zeros(128, 32).to(torch.float8_e4m3fn)
    w8 = torch.zeros(64, 32).to(torch.float8_e4m3fn)
    launches = sweep_launches(a8, w8)
    labels = [label for label, *_ in launches]
    assert len(set(labels)) == len(labels) == 2 * len(TILES) + 16
    assert "pointer/tma 256x128x64x8x3" in labels and "stream2/pointer 128x64x32x4x3" in labels
    assert not any(label.startswith("tma/") for label in labels)
    stream = [launch for launch in launches if launch[0].startswith("stream")]
    assert all(tile[1] in (64, 128) and tile[2] in (32, 64) for _, tile, *_ in stream)
    assert {(loads, per_sm) for _, _, loads, _, per_sm in stream} == {
        ("pointer", 2),
        ("pointer", 4),
    }
