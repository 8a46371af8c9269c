"""`quantstudy package` on CUDA: the FP8 engine packaged with its Triton kernels, loaded in a
fresh process without quantstudy, agreeing with the study's engine, timed; the C++ loader.

A tiny study (`test_efficientnet`, a seeded weights file, 12 generated images) is run on the
GPU with `generic_all` (1x1 products, depthwise and dense kxk FP8 convs: every kind of
packaged op), timed and packaged at batch 2 (one static FP8 and one fp16 package: each AOTInductor
compile takes a minute or more, and the suite's package group has eight) and checked. The C++
loader compiles against libtorch's headers (minutes of one core) while the packages build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image

from quantstudy.cli import main
from quantstudy.package.loader import loader_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cpp_build(tmp_path_factory):
    """Start compiling the C++ loader at once; test_cpp_loader_matches_python waits for it."""
    binary = tmp_path_factory.mktemp("cpp") / "run_package"
    build = ROOT / "examples" / "package-cpp" / "build.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.Popen(
        [str(build), str(binary)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    )  # fmt: skip
    yield binary, proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.fixture(scope="module")
def study(cpp_build, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("package_gpu")
    data = root / "data"
    g = torch.Generator().manual_seed(1)
    for wnid in ("n01440764", "n01443537"):
        (data / wnid).mkdir(parents=True)
        for i in range(6):
            pixels = (torch.rand(64, 64, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(data / wnid / f"img{i}.jpg")
    torch.manual_seed(0)
    torch.save(timm.create_model("test_efficientnet").state_dict(), root / "weights.pth")
    out = root / "study"
    args = f"run test_efficientnet --weights {root / 'weights.pth'} --device cuda --calib 4 "
    args += f"--heldout 8 --batches 2 --recipe generic_all --data {data} --out {out}"
    main(args.split())
    assert (out / "study.json").is_file()
    return out


@pytest.fixture(scope="module")
def packaged(study, tmp_path_factory) -> tuple[Path, int, str]:
    out = tmp_path_factory.mktemp("pkg") / "package"
    cmd = [sys.executable, "-m", "quantstudy.cli", "package", str(study), "--out", str(out)]
    done = subprocess.run([*cmd, "--check"], capture_output=True, text=True, timeout=1200)
    return out, done.returncode, done.stdout + done.stderr


def test_package_checks_without_quantstudy_and_agrees(packaged):
    out, status, printed = packaged
    assert status == 0, printed
    for line in ("[pass] without quantstudy", "[pass] NaN/Inf", "[pass] package vs FP8 engine"):
        assert line in printed, printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bound_to"]["device"] == "cuda"
    assert manifest["bound_to"]["capability"] >= "8.9"
    assert {"fp8_gemm", "fp8_depthwise", "fp8_conv2d"} <= set(manifest["fp8_ops"]), manifest
    assert manifest["tiles"], "the FP8 launches' tiles were captured at package time"
    files = sorted(e["file"] for e in manifest["packages"])
    assert files == ["fp16-b2.pt2", "fp8-b2.pt2"], files
    # the packaged x is printed beside the study's at the timed batch
    rows = [line.split() for line in printed.splitlines() if line.strip()[:1] == "2"]
    assert {r[0] for r in rows if len(r) >= 6} == {"2"}, printed


def test_the_fp8_package_computes_the_study_engines_logits_bit_for_bit(packaged):
    """The check gates on the floor; the claim is stronger: the package's launches, tuned again
    among the pointer tiles, write the bits the study's engine writes at the package's batch
    (every tile the prune keeps writes the same bits: docs/package.md), so every logit is the
    study's (0 differ and a largest difference of 0, as the check prints it)."""
    _, status, printed = packaged
    assert status == 0, printed
    (line,) = [x for x in printed.splitlines() if "package vs FP8 engine (fp8-b2.pt2)" in x]
    assert " (0 of " in line and "max |logit diff| 0;" in line, line


def test_cpp_loader_matches_python(packaged, cpp_build):
    out, status, printed = packaged
    assert status == 0, printed
    binary, build = cpp_build
    built, _ = build.communicate(timeout=600)
    assert build.returncode == 0, built[-3000:]
    package = out / "fp8-b2.pt2"
    # loaders start with torch's libstdc++ preloaded, as the check's do (docs/package.md)
    load_env, _ = loader_env()
    ran = subprocess.run(
        [str(binary), str(package), "cuda", "float16", "2", "3", "160", "160", "0.5"],
        capture_output=True, text=True, timeout=300, env=load_env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    cpp_top1 = [int(line.split()[1]) for line in ran.stdout.splitlines() if line.startswith("top1")]
    script = (
        "import sys, torch; from torch._inductor import aoti_load_package; "
        f"m = aoti_load_package({str(package)!r}); "
        "x = torch.full((2, 3, 160, 160), 0.5, dtype=torch.float16, device='cuda')"
        ".contiguous(memory_format=torch.channels_last); "
        "print(m(x).float().argmax(1).tolist())"
    )
    py = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, env=load_env
    )
    assert py.returncode == 0, py.stderr[-3000:]
    assert cpp_top1 == json.loads(py.stdout.strip().splitlines()[-1])
