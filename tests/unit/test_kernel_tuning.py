"""One tuning path for the autotuned kernels (`quant/kernels/tuning.py`, `choices.py`), on CPU:
the convs' bound on the configs a cold tune compiles, the stored choice a second process
launches without tuning, the parallel compile ahead of timing, the untimed launch, and the
kxk and depthwise convs tuned for real under Triton's interpreter (timing faked)."""

import json
from pathlib import Path

import pytest
import torch
from _interpreter import require_triton, run_interpreted

require_triton()  # CUDA builds of torch ship Triton: skip only on a build without it

import triton  # noqa: E402
from triton.runtime import _async_compile  # noqa: E402

from quantstudy.env.switches import GEMM_CONFIGS  # noqa: E402
from quantstudy.quant.kernels import choices, search, tiles, tuning  # noqa: E402
from quantstudy.quant.kernels.conv import FP8_CONV  # noqa: E402
from quantstudy.quant.kernels.depthwise import DEPTHWISE  # noqa: E402

# resnet50's dense kxk convs at 224 px: (CIN padded to 16 as the layer pads it, N, HO, WO).
RESNET50 = [
    (16, 64, 112, 112),  # the 7x7 stem
    (64, 64, 56, 56),
    (128, 128, 28, 28),  # the stride-2 conv of stage 2, then its stride-1 ones: one shape
    (256, 256, 14, 14),
    (512, 512, 7, 7),
]
# Lite0's depthwise convs: (C, HO, WO).
LITE0 = [(32, 112, 112), (96, 56, 56), (144, 56, 56), (144, 28, 28), (240, 28, 28)]
LITE0 += [(240, 14, 14), (480, 14, 14), (672, 14, 14), (672, 7, 7), (1152, 7, 7)]


def _blocks(configs: list) -> list[tuple[int, ...]]:
    return [tuple(c.kwargs.values()) for c in configs]


def _conv(m: int, n: int, cin: int, **meta) -> list:
    return FP8_CONV.prune(FP8_CONV.configs, {"M": m, "N": n, "CIN": cin}, **meta)


def test_the_conv_prune_keeps_at_most_four_tiles_ranked_by_the_shape():
    """Four tiles per launch at most, ranked as `tiles.bounded` says: at batch 128 every tile
    fills the GPU and the table's order decides among the fitting ones; at batch 1 the tiles
    that give the most programs come first; resnet50's last stage at batch 1 (M 49) keeps only
    64-row tiles. resnet50 at batches 1 and 128 compiles 30 + 32 configs cold where the prune
    without the bound kept 69 per batch."""
    assert tiles.CONV_CONFIGS == 4
    assert _blocks(_conv(128 * 56 * 56, 64, 64)) == [
        (256, 64, 32), (128, 64, 32), (128, 64, 64), (64, 64, 32)
    ]  # fmt: skip
    assert _blocks(_conv(56 * 56, 64, 64)) == [
        (64, 32, 32), (128, 32, 32), (64, 64, 32), (128, 64, 32)
    ]  # fmt: skip
    assert _blocks(_conv(7 * 7, 512, 512)) == [(64, 32, 32), (64, 64, 32), (64, 128, 64)]
    counts = {b: [len(_conv(b * ho * wo, n, cin)) for cin, n, ho, wo in RESNET50] for b in (1, 128)}
    assert counts == {1: [4, 4, 4, 4, 3], 128: [4, 4, 4, 4, 4]}
    # the distinct shapes of a study: the stride-2 conv opening stages 2-4 is one more each
    strided = [(128, 128, 28, 28), (256, 256, 14, 14), (512, 512, 7, 7)]
    total = sum(len(_conv(b * ho * wo, n, c)) for b in (1, 128) for c, n, ho, wo in RESNET50)
    total += sum(len(_conv(b * ho * wo, n, c)) for b in (1, 128) for c, n, ho, wo in strided)
    assert total == 30 + 32


def test_kept_conv_tiles_pad_every_tap_alike_and_promote_where_the_engine_does():
    """CIN 208 (res2net): 32-channel steps pad a tap to 224, 64-channel ones to 256, so only the
    former stay (each kept tile then sums the same products between promotions: the same bits);
    CIN 512 pads alike under both. No tile deeper than the promotion; none at all is an error."""
    assert {c.kwargs["BLOCK_K"] for c in _conv(128 * 196, 208, 208)} == {32}
    assert {c.kwargs["BLOCK_K"] for c in _conv(128 * 49, 512, 512)} == {32, 64}
    assert {c.kwargs["BLOCK_K"] for c in _conv(128 * 49, 512, 512, PROMOTE=32)} == {32}
    with pytest.raises(ValueError, match="BLOCK_K <= 16"):
        _conv(128 * 49, 512, 512, PROMOTE=16)


def test_the_depthwise_prune_keeps_at_most_four_tiles_per_lite0_shape():
    """C 32 fits one tile (BLOCK_C 32 only: no timing at all); C 144 ranks by the share of real
    channels (144 of 160 in 32-wide blocks, of 192 in 64-wide)."""
    kept = {(c, b): DEPTHWISE.prune(DEPTHWISE.configs, {"P": b * h * w, "C": c})
            for c, h, w in LITE0 for b in (1, 128)}  # fmt: skip
    assert max(map(len, kept.values())) == tiles.CONV_CONFIGS
    assert _blocks(kept[32, 128]) == [(128, 32)]
    assert _blocks(kept[144, 128])[:3] == [(128, 32), (64, 64), (128, 64)]
    assert sum(map(len, kept.values())) == 2 + 4 * (len(kept) - 2)


def test_bounded_falls_back_to_the_smallest_tile_where_none_fits():
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}) for m, n in [(128, 64), (64, 32)]]
    kept = tiles.bounded(configs, {"BLOCK_M": 8, "BLOCK_N": 8}, {}, grid=("BLOCK_M",))
    assert _blocks(kept) == [(64, 32)]


def test_tiles_rank_by_programs_up_to_the_gpus_multiprocessors(monkeypatch):
    """A tile that gives more programs ranks first only up to the device's SM count: on a GPU
    of 4 SMs, 4 and 8 programs tie and the table's order decides; off CUDA the count is 132."""
    import torch

    assert tiles.fill_programs() == tiles.CPU_FILL_PROGRAMS == 132
    configs = [triton.Config({"BLOCK_M": m}) for m in (64, 32)]  # 4 and 8 programs of M 256
    assert _blocks(tiles.bounded(configs, {"BLOCK_M": 256}, {}, grid=("BLOCK_M",))) == [
        (32,),
        (64,),
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tiles, "_sm_count", lambda device: 4)
    assert tiles.fill_programs() == 4
    assert _blocks(tiles.bounded(configs, {"BLOCK_M": 256}, {}, grid=("BLOCK_M",))) == [
        (64,),
        (32,),
    ]


# --- The tuning path with a fake kernel and timing: what is stored, read and compiled ---------


def fake_body(x, M, OPT, BLOCK):
    """What a fake kernel computes, as a shipped table hashes it (`kernel_source.py`)."""
    return x * OPT + BLOCK


class FakeKernel:
    """Records its launches (the config's block) and its compiles ahead of timing."""

    cache_key = "fake kernel source"
    arg_names = ("x", "M", "OPT", "BLOCK")

    def __init__(self, fn=fake_body) -> None:
        self.fn = fn
        self.launched: list[int] = []
        self.warmed: list[tuple[int, bool]] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launched.append(kw["BLOCK"])

    def warmup(self, *args, grid, **kw):
        self.warmed.append((kw["BLOCK"], _async_compile.active_mode.get() is not None))


def _prune(configs, named, **meta):
    """Blocks up to M, widest first."""
    return sorted(
        (c for c in configs if c.kwargs["BLOCK"] <= named["M"]), key=lambda c: -c.kwargs["BLOCK"]
    )


def _fake(blocks=(16, 32, 64, 128)) -> tuning.Tuned:
    configs = [triton.Config({"BLOCK": b}) for b in blocks]
    return tuning.Tuned("fake", FakeKernel(), configs, ["M", "OPT"], _prune)


@pytest.fixture
def timed(monkeypatch) -> list[int]:
    """Timing faked, both rounds: a launch of block 32 takes 1 ms, others 2 ms plus a little
    per block (so 16 is next). Returns the blocks timed, in order."""
    blocks: list[int] = []

    def timer(fn):
        fn()
        block = fn.keywords["BLOCK"]  # a config's launch: its meta bound (`tuning._launcher`)
        blocks.append(block)
        return 1.0 if block == 32 else 2.0 + block / 1000

    monkeypatch.setattr(search, "screen_time", timer)
    monkeypatch.setattr(search, "full_time", timer)
    return blocks


@pytest.fixture
def store(tmp_path: Path, monkeypatch, timed) -> Path:
    """An empty store for this test (and none of this process's earlier choices)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("QUANTSTUDY_TUNE_LOG", raising=False)
    monkeypatch.setenv("QUANTSTUDY_TRITON_COMPILE_THREADS", "3")
    choices.forget()
    yield tmp_path / choices.FILE
    choices.forget()


def _launch(tuned: tuning.Tuned, m: int = 100) -> int:
    """The block of the config a launch of M `m` took."""
    config = tuning.tuned_launch(tuned, lambda meta: (1,), (torch.zeros(2), m), {"OPT": 1})
    return int(config.kwargs["BLOCK"])


def test_a_second_process_launches_the_stored_choice_without_tuning(store: Path, timed):
    fake = _fake()
    assert _launch(fake) == 32 and sorted(timed) == [16, 32, 64]  # pruned [64, 32, 16]: timed
    assert fake.kernel.launched[-1] == 32  # and the fastest launched
    row = tuning.TUNE_LOG[-1]
    assert (row["kernel"], row["M"], row["OPT"], row["configs"]) == ("fake", 100, 1, 3)
    assert (row["screened"], row["finalists"], row["failed"]) == (0, 3, 0)  # three: no screen
    data = json.loads(store.read_text())
    assert data["format"] == choices.FORMAT
    [entry] = data["choices"].values()
    assert entry["config"] == 1 and entry["chosen"] == str(
        fake.configs[1]
    )  # and what a table needs
    assert (entry["kernel"], entry["launch"], entry["gpu"]) == ("fake", {"M": 100, "OPT": 1}, "cpu")
    choices.forget()  # what a new process finds: the file alone
    fake.kernel.launched.clear()
    assert _launch(fake) == 32 and len(timed) == 3
    assert fake.kernel.launched == [32]  # launched directly, with the stored config
    assert _launch(fake, m=20) == 16 and len(timed) == 4  # another shape: tuned
    assert len(json.loads(store.read_text())["choices"]) == 2


def test_pruned_configs_compile_in_parallel_before_timing(store: Path, monkeypatch):
    """Each pruned config is compiled once inside Triton's AsyncCompileMode (a thread pool),
    before they are timed; the log says with how many threads. One thread: none."""
    fake = _fake()
    _launch(fake)
    assert fake.kernel.warmed == [(64, True), (32, True), (16, True)]
    assert tuning.TUNE_LOG[-1]["threads"] == 3
    monkeypatch.setenv("QUANTSTUDY_TRITON_COMPILE_THREADS", "1")
    serial = _fake()
    _launch(serial, m=50)
    assert serial.kernel.warmed == [] and tuning.TUNE_LOG[-1]["threads"] == 1


def test_a_store_of_another_format_or_damaged_is_cold_and_replaced(store: Path):
    fake = _fake()
    key = choices.launch_key(fake, (torch.zeros(2), 100), {"OPT": 1})
    for text in (json.dumps({key: {"config": 0}}), "{not json", json.dumps({"format": 1})):
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(text)
        choices.forget()
        assert choices.lookup(key, 4) is None
    _launch(fake)
    assert list(json.loads(store.read_text())["choices"]) == [key]
    assert json.loads(store.read_text())["choices"][key]["config"] == 1


def test_a_stored_index_holds_only_under_the_same_config_list(store: Path):
    """Another config list (or kernel source) is another search space: another key."""
    args, meta = (torch.zeros(2), 100), {"OPT": 1}
    a = choices.launch_key(_fake(), args, meta)
    assert a == choices.launch_key(_fake(), args, meta)
    assert a != choices.launch_key(_fake(blocks=(16, 32, 64)), args, meta)
    assert a != choices.launch_key(_fake(), args, {"OPT": 2})


def test_an_untimed_launch_takes_the_first_pruned_config_and_stores_nothing(store: Path, timed):
    fake = _fake()
    with tuning.untimed_tiles():
        assert _launch(fake) == 64 and timed == []
    assert not store.exists()
    assert _launch(fake) == 32 and len(timed) == 3  # timed: tuned and stored
    with tuning.untimed_tiles():
        assert _launch(fake) == 32  # untimed, a stored choice is still the one launched


def test_a_compile_time_option_outside_the_autotuners_key_is_refused(store: Path):
    with pytest.raises(ValueError, match=r"\['ROUND'\] are not in the autotuner's key"):
        tuning.tuned_launch(_fake(), lambda m: (1,), (torch.zeros(2), 9), {"OPT": 1, "ROUND": 0})


def test_the_products_key_holds_every_compile_time_option_its_launcher_passes():
    from quantstudy.quant.kernels.gemm import _options
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM

    meta = _options("none", None, torch.ones(()), False, None, None, "none", None, False)
    assert {*meta, "OUT_FP8", "ROUND", "PROMOTE"} <= set(FP8_GEMM.keys)


def test_summary_adds_up_the_tuned_launches_per_kernel():
    rows = [{"kernel": k, "configs": c, "compile_s": 1.5, "tune_s": 0.25}
            for k, c in [("fp8_conv2d", 4), ("fp8_conv2d", 3), ("depthwise", 1)]]  # fmt: skip
    assert tuning.summary(rows) == {
        "fp8_conv2d": {"launches": 2, "configs": 7, "compile_s": 3.0, "tune_s": 0.5},
        "depthwise": {"launches": 1, "configs": 1, "compile_s": 1.5, "tune_s": 0.25},
    }


def test_the_convs_tune_store_and_relaunch_under_the_interpreter(tmp_path: Path):
    """The real kxk and depthwise launchers with `tile=None`: the search runs each pruned config
    (its timing faked to prefer the last timed; the interpreter has no CUDA graphs), the four
    of each screened and three timed again,
    after the configs were handed to the parallel compile; the choice is stored, and a launch
    that finds only the file (a new process) takes it without tuning and writes the same bits,
    which are those of the same tile launched fixed."""
    out = run_interpreted(
        f"""
        import os, torch
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "{tmp_path / "inductor"}"
        os.environ["QUANTSTUDY_TRITON_COMPILE_THREADS"] = "2"
        from quantstudy.quant.kernels import choices, search, tuning
        from quantstudy.quant.kernels.conv import FP8_CONV, fp8_conv2d_triton
        from quantstudy.quant.kernels.depthwise import DEPTHWISE, depthwise_taps
        timed, warmed = [], []
        def bench(fn):  # runs the config once; later ones "faster"
            fn()
            timed.append(1)
            return 100.0 - len(timed)
        search.screen_time = search.full_time = bench
        def warmup(*args, grid, **meta):
            warmed.append(meta)
        for tuned in (FP8_CONV, DEPTHWISE):
            tuned.kernel.warmup = warmup
        g = torch.Generator().manual_seed(0)
        cl = torch.channels_last
        x = torch.randn(1, 64, 12, 12, generator=g)
        x = x.to(torch.float8_e4m3fn).contiguous(memory_format=cl)
        w = torch.randn(64, 9 * 64, generator=g).to(torch.float8_e4m3fn)
        ws, xs = torch.rand(64, generator=g) / 100, torch.tensor(0.02)
        def conv(tile=None):
            return fp8_conv2d_triton(x, w, (3, 3), ws, xs, None, "relu", torch.float32,
                                     padding=(1, 1), tile=tile)
        xd = torch.randn(1, 96, 9, 9, generator=g).contiguous(memory_format=cl)
        taps = torch.randn(9, 96, generator=g)
        def dw(tile=None):
            return depthwise_taps(xd, taps, (3, 3), None, 1, (1, 1), (9, 9), "relu6",
                                  out_dtype=torch.float32, tile=tile)
        rows = []
        for run, tuned, launch in ((conv, FP8_CONV, ("num_warps", "num_stages")),
                                   (dw, DEPTHWISE, ("num_warps",))):
            first = run()
            row = tuning.TUNE_LOG[-1]
            best = next(c for c in tuned.configs if str(c) == row["best"])
            n, logged = len(timed), len(tuning.TUNE_LOG)
            choices.forget()
            again = run()
            kw = best.all_kwargs()
            tile = tuple(v for k, v in kw.items() if k.startswith("BLOCK_")) + tuple(
                kw[k] for k in launch)
            rows.append((row["kernel"], row["configs"], row["screened"], row["finalists"],
                         row["threads"], n == len(timed),
                         logged == len(tuning.TUNE_LOG), torch.equal(first, again),
                         torch.equal(first, run(tile=tile))))
        print(len(warmed), *[",".join(map(str, r)) for r in rows])
        """
    )
    warmed, conv, dw = out
    assert conv == "fp8_conv2d,4,4,3,2,True,True,True,True"
    assert dw == "depthwise,4,4,3,2,True,True,True,True"
    assert int(warmed) == 8  # every pruned config of both, handed to the parallel compile


def test_a_gemm_bound_keeps_the_best_ranked_configs_only_where_asked(monkeypatch):
    """`$QUANTSTUDY_GEMM_CONFIGS` (a lab setting, unset by default) bounds the product's pruned
    configs per launch as `tiles.bounded` ranks them; unset, every pruned config is kept; a
    bad value is one clear line."""
    from quantstudy.quant.kernels.gemm_kernel import FP8_GEMM
    from quantstudy.record.errors import UserError

    shape = {"M": 25216, "N": 3072, "K": 768, "tma_loads_ok": True, "tma_store_ok": True}
    monkeypatch.delenv(GEMM_CONFIGS, raising=False)
    every = FP8_GEMM.prune(FP8_GEMM.configs, shape)
    assert len(every) > 8  # ViT-B's fc1 at batch 128: the autotuner times them all
    monkeypatch.setenv(GEMM_CONFIGS, "6")
    kept = FP8_GEMM.prune(FP8_GEMM.configs, shape)
    # The ranking (`tiles.bounded`) written out for this shape: every tile gives the grid at
    # least the GPU's programs and pads the work by under a twentieth (asserted), so programs and
    # padding tie and the descriptor paths decide, loads then store, then the table's order.
    dims = {"BLOCK_M": 25216, "BLOCK_N": 3072, "BLOCK_K": 768}
    tiles_of = {b: [-(-n // c.kwargs[b]) for c in every] for b, n in dims.items()}
    programs = [m * n for m, n in zip(tiles_of["BLOCK_M"], tiles_of["BLOCK_N"], strict=True)]
    assert min(programs) >= tiles.fill_programs()
    for i, c in enumerate(every):
        real = 1.0
        for b, n in dims.items():
            real *= n / (tiles_of[b][i] * c.kwargs[b])
        assert round(real, 1) == 1.0, c
    paths = sorted(every, key=lambda c: (-c.kwargs["TMA_LOADS"], -c.kwargs["TMA_STORE"]))
    assert kept == paths[:6]  # sorted() is stable: the table's order within each path
    assert all(c.kwargs["TMA_LOADS"] for c in kept) and kept[0].kwargs["TMA_STORE"]
    monkeypatch.setenv(GEMM_CONFIGS, "0")
    with pytest.raises(UserError, match="QUANTSTUDY_GEMM_CONFIGS='0': give a whole number"):
        FP8_GEMM.prune(FP8_GEMM.configs, shape)
