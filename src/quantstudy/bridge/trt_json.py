"""Readers of trtexec's JSON exports, each format checked before any number is taken from it.

Formats, from TensorRT's own source (NVIDIA/TensorRT):
- `--exportTimes`: `samples/common/sampleReporting.cpp` `exportJSONTrace`: a list with one object
  per timed inference (warm-ups left out) holding `startEnqMs`, `endEnqMs`, `startH2dMs`,
  `endH2dMs`, `startComputeMs`, `endComputeMs`, `startD2hMs`, `endD2hMs`, `h2dMs`, `computeMs`,
  `d2hMs`, `latencyMs`.
- `--exportProfile`: the same file, `Profiler::exportJSONProfile`: a list whose first object is
  `{"count": <profiled runs>}`, then one object per engine layer with `name`, `timeMs` (total),
  `averageMs`, `medianMs` (newer releases) and `percentage`.
- `--exportLayerInfo`: the engine inspector's JSON (`IEngineInspector::getEngineInformation`,
  written by `printLayerInfo` in the same file): `{"Layers": [...], "Bindings": [...]}` in
  TensorRT 10, `"I/O Tensors"` in place of `"Bindings"` in 11 (TensorRT's 10.x-to-11.x
  IEngineInspector migration guide). With `--profilingVerbosity=detailed` each layer is an
  object with `Name`, `LayerType`, `Inputs`/`Outputs` (each `Name`, `Dimensions`,
  `Format/Datatype`) and the layer's parameters (`Groups`, `Kernel`, `Weights`...); without it
  a layer is only its name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantstudy.bridge.qdq import INPUT
from quantstudy.record.errors import UserError
from quantstudy.record.readers import not_a_file, read_json

# The plausible GPU time of one inference, in ms: no engine runs in under 0.1 us (a kernel
# launch alone takes microseconds), none in over 1000 s. A time outside is a unit error or an
# edited file; 1e-320 would make x infinite and 1e308 would overflow the report's plots.
MIN_MS, MAX_MS = 1e-4, 1e6


def _load(path: Path, what: str) -> Any:
    if not_a_file(path) == "missing":  # a pipe or a folder: refused by `read_json`, unopened
        raise UserError(f"{path} is missing: run the {what} line of trtexec.sh for it")
    try:
        return read_json(path, "trtexec export", finite=False)  # each number used is checked
    except UserError as e:
        raise UserError(f"{e}; rerun trtexec for it") from None


def _number(v: Any) -> bool:
    """A finite number: a NaN or infinite time (JSON's `NaN`, `Infinity`) is no timing."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_times(path: Path) -> list[float]:
    """GPU compute time (ms) of every timed inference in an `--exportTimes` file."""
    data = _load(path, "--exportTimes")
    if not isinstance(data, list) or not data:
        raise UserError(f"{path} is not trtexec --exportTimes output (a non-empty JSON list)")
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not all(
            _number(row.get(k)) for k in ("computeMs", "latencyMs")
        ):
            raise UserError(
                f"{path}: entry {i} has no finite numeric computeMs/latencyMs; not trtexec "
                "--exportTimes output"
            )
        if not MIN_MS <= row["computeMs"] <= MAX_MS:
            raise UserError(
                f"{path}: entry {i} has computeMs {row['computeMs']:g}; a GPU inference takes "
                f"{MIN_MS:g} to {MAX_MS:g} ms: not a timing"
            )
    return [float(row["computeMs"]) for row in data]


@dataclass(frozen=True)
class ProfiledLayer:
    name: str
    average_ms: float


def read_profile(path: Path) -> list[ProfiledLayer]:
    """Average time per inference of every engine layer in an `--exportProfile` file."""
    data = _load(path, "--exportProfile")
    if (
        not isinstance(data, list)
        or len(data) < 2
        or not isinstance(data[0], dict)
        or not _number(data[0].get("count"))
    ):
        raise UserError(
            f"{path} is not trtexec --exportProfile output (a list starting with "
            '{"count": N} and one entry per layer)'
        )
    layers = []
    for i, row in enumerate(data[1:], start=1):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("name"), str)
            or not _number(row.get("averageMs"))
        ):
            raise UserError(
                f"{path}: entry {i} has no name and finite averageMs; not a trtexec profile"
            )
        if not 0 <= row["averageMs"] <= MAX_MS:
            raise UserError(
                f"{path}: entry {i} has averageMs {row['averageMs']:g}; a layer takes 0 to "
                f"{MAX_MS:g} ms: not a timing"
            )
        layers.append(ProfiledLayer(row["name"], float(row["averageMs"])))
    return layers


@dataclass(frozen=True)
class EngineLayer:
    """One engine layer from `--exportLayerInfo` (detailed)."""

    name: str
    layer_type: str
    input_format: str  # Format/Datatype of its first input
    weights_type: str | None
    groups: int | None

    @property
    def precision(self) -> str:
        """fp8, int8, fp16, bf16 or fp32, from the input's format and the weights' type."""
        text = f"{self.input_format} {self.weights_type or ''}".lower()
        for token, name in (("fp8", "fp8"), ("int8", "int8"), ("bf16", "bf16")):
            if token in text:
                return name
        if "fp16" in text or "half" in text:
            return "fp16"
        if "fp32" in text or "float" in text:
            return "fp32"
        return "unknown"


@dataclass(frozen=True)
class LayerInfo:
    batch: int
    layers: list[EngineLayer]


def read_layer_info(path: Path) -> LayerInfo:
    """Engine layers and the batch the engine was built for, from `--exportLayerInfo`."""
    data = _load(path, "--exportLayerInfo")
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise UserError(f'{path} is not trtexec --exportLayerInfo output (no "Layers" list)')
    rows = data["Layers"]
    if rows and not all(isinstance(r, dict) for r in rows):
        raise UserError(
            f"{path} lists layer names only: the engine was built without "
            "--profilingVerbosity=detailed; rebuild it with trtexec.sh"
        )
    layers = [
        EngineLayer(
            str(r.get("Name", "")),
            str(r.get("LayerType", "")),
            _first_format(r),
            (r.get("Weights") or {}).get("Type") if isinstance(r.get("Weights"), dict) else None,
            r.get("Groups") if isinstance(r.get("Groups"), int) else None,
        )
        for r in rows
    ]
    return LayerInfo(_batch(data, path), layers)


def _first_format(row: dict[str, Any]) -> str:
    inputs = row.get("Inputs") or []
    return (
        str(inputs[0].get("Format/Datatype", "")) if inputs and isinstance(inputs[0], dict) else ""
    )


def _batch(data: dict[str, Any], path: Path) -> int:
    """The engine's input batch: TensorRT 11's I/O tensor list, else the dimensions with which
    a layer reads the network input."""
    for t in data.get("I/O Tensors") or []:
        if isinstance(t, dict) and t.get("Name") == INPUT and t.get("Dimensions"):
            return _first_dimension(t["Dimensions"], path)
    for row in data["Layers"]:
        for t in row.get("Inputs") or []:
            if isinstance(t, dict) and t.get("Name") == INPUT and t.get("Dimensions"):
                return _first_dimension(t["Dimensions"], path)
    raise UserError(
        f"{path}: no layer reads the network input '{INPUT}'; not an engine of a quantstudy export"
    )


def _first_dimension(dims: Any, path: Path) -> int:
    """The batch: the first of the input's dimensions, a whole number of at least 1."""
    first: Any = dims[0] if isinstance(dims, list) and dims else None
    if not _number(first) or first != int(first) or first < 1:
        raise UserError(
            f"{path}: the network input's dimensions {dims!r} name no batch (a whole number of "
            "at least 1 first); not an engine of a quantstudy export"
        )
    return int(first)


TRTEXEC_VERSION = re.compile(r"TensorRT version: (\S+)")
TRTEXEC_DEVICE = re.compile(r"Selected Device: (.+)")


def read_log(path: Path) -> dict[str, str]:
    """TensorRT version and GPU name from trtexec's log (`b<B>.log`), when it is there."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8", errors="replace")
    found = {}
    for key, pattern in (("tensorrt", TRTEXEC_VERSION), ("device", TRTEXEC_DEVICE)):
        m = pattern.search(text)
        if m:
            found[key] = m.group(1).strip()
    return found
