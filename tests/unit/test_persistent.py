"""The fused product's persistent programs (`_persistent`) under Triton's interpreter: the same
bits as one tile per program, whatever the epilogue, and refused where they cannot run."""

from _interpreter import require_triton, run_interpreted


def test_persistent_programs_write_the_bits_of_one_tile_per_program():
    """4 programs (the interpreter's SM count) walk 15 or 12 tiles, ragged in M, N and K,
    through every epilogue the engine uses; with and without the subtiled epilogue."""
    require_triton()
    runs, differ = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        g = torch.Generator().manual_seed(3)
        runs, differ = 0, 0
        for m, k, n in [(150, 160, 96), (70, 256, 112)]:
            xq = (torch.randn(m, k, generator=g) * 3).to(torch.float8_e4m3fn)
            w8 = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
            ws, xs = torch.rand(n, generator=g) + 0.5, torch.tensor(0.7)
            rows = torch.rand(m, 1, generator=g) + 0.5  # dynamic per-row scales
            b = torch.randn(n, generator=g)  # seeded: the script runs in a process of its own
            res = torch.randn(m, n, generator=g).half()
            out_scale = torch.tensor(4.0)
            epilogues = [
                dict(act="gelu", out_dtype=torch.float16),
                dict(act="relu", out_dtype=torch.float16, residual=res, res_act="relu"),
                dict(act="gelu", out_dtype=torch.float8_e4m3fn, out_scale=out_scale),
                dict(act="none", out_dtype=torch.float16, residual=res,
                     pair=torch.empty(m, n, dtype=torch.float8_e4m3fn), out_scale=out_scale),
                dict(act="silu", out_dtype=torch.float16, x_scale=rows),
            ]
            for kw in epilogues:
                kw = dict(kw)
                scale = kw.pop("x_scale", xs)
                act, dtype = kw.pop("act"), kw.pop("out_dtype")
                def call(**extra):
                    pair = kw.get("pair")
                    y = fp8_gemm_triton(
                        xq, w8, ws, scale, b, act, dtype, (32, 32, 64, 4, 2), "tma", "tma",
                        round_to=torch.float16, **kw, **extra,
                    )
                    return y.float(), (pair.float() if pair is not None else None)
                base, base_pair = call()
                for sub in (False, True):
                    y, pair = call(persistent=True, subtile=sub)
                    runs += 1
                    same = torch.equal(y, base) and (pair is None or torch.equal(pair, base_pair))
                    differ += not same
        print(runs, differ)
        """
    )
    assert (int(runs), int(differ)) == (2 * 5 * 2, 0)


def test_persistent_options_are_refused_where_they_cannot_run():
    """A persistent launch through pointer loads, and a subtiled epilogue without persistent
    programs, each refused with its own reason (a ValueError of another check, a misaligned
    descriptor say, would not do)."""
    require_triton()
    (said,) = run_interpreted(
        """
        import torch
        from quantstudy.quant.kernels.gemm import fp8_gemm_triton
        xq = torch.zeros(64, 24).to(torch.float8_e4m3fn)  # 24-byte rows: no descriptor loads
        w8 = torch.zeros(32, 24).to(torch.float8_e4m3fn)
        ws, xs = torch.ones(32), torch.tensor(1.0)
        said = []
        for extra in (dict(persistent=True), dict(subtile=True)):
            try:
                fp8_gemm_triton(xq, w8, ws, xs, None, "none", torch.float16, (32, 32, 32),
                                "pointer", "pointer", **extra)
                said.append("ran")
            except ValueError as e:
                said.append(str(e))
        print("|".join(said).replace(" ", "_"))
        """
    )
    persistent, subtile = said.replace("_", " ").split("|")
    assert persistent == "persistent programs load through tensor descriptors, one tile at a time"
    assert subtile == "a subtiled epilogue needs persistent programs"
