"""gpu_clocks: parsed from nvidia-smi when it answers, {} when it is absent or fails."""

import os
import stat

from quantstudy.speed.clocks import QUERY_FIELDS, gpu_clocks


def fake_nvidia_smi(tmp_path, monkeypatch, stdout: str, code: int = 0):
    script = tmp_path / "nvidia-smi"
    args_file = tmp_path / "args.txt"
    script.write_text(
        f'#!/bin/sh\necho "$@" > "{args_file}"\ncat <<\'EOF\'\n{stdout}EOF\nexit {code}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return args_file


LINE = "NVIDIA H200, 570.124.06, 1980 MHz, 3201 MHz, 1980 MHz, 121.33 W, 34\n"


def test_parses_one_gpu(tmp_path, monkeypatch):
    args_file = fake_nvidia_smi(tmp_path, monkeypatch, LINE)
    clocks = gpu_clocks()
    assert clocks == {
        "name": "NVIDIA H200",
        "driver_version": "570.124.06",
        "clocks.sm": "1980 MHz",
        "clocks.mem": "3201 MHz",
        "clocks.max.sm": "1980 MHz",
        "power.draw": "121.33 W",
        "temperature.gpu": "34",
        "gpu_match": "only GPU listed by nvidia-smi",
    }
    assert f"--query-gpu={','.join(QUERY_FIELDS)}" in args_file.read_text()


def test_several_gpus_without_a_match_say_so(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, LINE + LINE.replace("34", "40"))
    clocks = gpu_clocks()
    assert clocks["temperature.gpu"] == "34"
    assert clocks["gpu_match"].startswith("first of 2 GPUs")


def test_failing_nvidia_smi_gives_empty(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA-SMI has failed\n", code=9)
    assert gpu_clocks() == {}


def test_unparseable_output_gives_empty(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "garbage\n")
    assert gpu_clocks() == {}


def test_absent_nvidia_smi_gives_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_clocks() == {}
