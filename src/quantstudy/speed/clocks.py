"""GPU clocks, power and temperature around a timing run, from nvidia-smi.

Timings are only comparable at the same clocks; recording them at the start and the end of a run
shows a throttled or down-clocked GPU. Reading them is best-effort: without nvidia-smi, or if it
fails, the result is an empty dict and the study goes on (the record then simply has no clocks).
"""

from __future__ import annotations

import shutil
import subprocess

import torch

QUERY_FIELDS = (
    "name",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "power.draw",
    "temperature.gpu",
)
"""nvidia-smi --query-gpu fields, recorded under these names."""

TIMEOUT_S = 10.0


def _device_selector(device: torch.device | int | None) -> str | None:
    """The nvidia-smi `-i` id ("GPU-<uuid>") of a torch CUDA device, or None if unknown.

    nvidia-smi ignores CUDA_VISIBLE_DEVICES, so torch's device index is not nvidia-smi's index;
    the UUID names the same GPU in both.
    """
    if device is None or not torch.cuda.is_available():
        return None
    index = device if isinstance(device, int) else torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if not uuid:
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def _query(selector: str | None) -> list[list[str]] | None:
    command = [
        "nvidia-smi",
        f"--query-gpu={','.join(QUERY_FIELDS)}",
        "--format=csv,noheader",
    ]
    if selector is not None:
        command.append(f"--id={selector}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines()]
    rows = [row for row in rows if len(row) == len(QUERY_FIELDS)]
    return rows or None


def gpu_clocks(device: torch.device | int | None = None) -> dict[str, str]:
    """Clocks, power, temperature, name and driver of the GPU behind `device`; {} if unavailable.

    Values keep nvidia-smi's units ("1980 MHz", "121.33 W"). When the torch device cannot be
    matched to an nvidia-smi GPU (no UUID) and several GPUs are listed, the first is reported and
    the entry "gpu_match" says so. Never raises.
    """
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        selector = _device_selector(device)
        rows = _query(selector)
        note = f"nvidia-smi --id={selector}" if selector else "only GPU listed by nvidia-smi"
        if rows is None and selector is not None:
            rows = _query(None)
            note = "only GPU listed by nvidia-smi"
        if rows is None:
            return {}
        if len(rows) > 1:
            note = f"first of {len(rows)} GPUs listed by nvidia-smi (torch device not matched)"
        clocks = dict(zip(QUERY_FIELDS, rows[0], strict=True))
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError):
        return {}
    clocks["gpu_match"] = note
    return clocks
