"""Which GPU, torch and Triton the process runs on (`env/machine.py`), read once for every record
and cache: a study's environment (with its Triton since schema 25), a bench record's provenance,
the kernel choice's cache key and a package's bound machine name them alike."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import torch

import quantstudy
from quantstudy.env.machine import Machine, device_label, gpu_name, triton_version

CPU = torch.device("cpu")


def test_off_the_gpu_only_the_versions_are_named():
    machine = Machine.of(CPU)
    assert machine == Machine(torch=torch.__version__, triton=triton_version())
    assert gpu_name(CPU) is None and device_label(CPU) == "cpu"
    if importlib.util.find_spec("triton") is None:
        assert triton_version() is None
    else:
        import triton

        assert triton_version() == triton.__version__


def test_every_record_and_key_takes_the_same_names():
    from quantstudy.bench.provenance import collect_provenance
    from quantstudy.engines.kernel_choice import _versions
    from quantstudy.package.manifest import bound_to, versions
    from quantstudy.study.environment import collect_environment

    triton = triton_version()
    env = collect_environment(CPU)
    assert env.triton == triton and env.torch == torch.__version__ and env.gpu_name is None
    assert collect_provenance(CPU, ["bench"]).triton == triton
    assert _versions(CPU).startswith(f"cpu|torch {torch.__version__}|triton {triton}|")
    assert versions()["triton"] == triton
    assert bound_to(CPU) == {"device": "cpu", "torch": torch.__version__}


# What names the machine: read in `env/machine.py` only (the rule the test below holds).
MACHINE_READS = (
    "torch.__version__",
    "torch.version.cuda",
    "torch.cuda.get_device_name",
    "torch.cuda.get_device_capability",
    "triton.__version__",
)
PACKAGE = Path(quantstudy.__file__).parent
READER = PACKAGE / "env" / "machine.py"
# Run beside a package with torch alone, where quantstudy refuses to import: it cannot ask
# `env/machine.py`, and compares its own reads with a manifest that `env/machine.py` wrote.
STANDALONE = {PACKAGE / "package" / "shipped_check.py"}


def _machine_reads(path: Path) -> list[str]:
    """Each read of `MACHINE_READS` in `path`, as "line: name", through import aliases too
    (`import torch as t`, `from torch.cuda import get_device_name`)."""
    tree = ast.parse(path.read_text(), str(path))
    alias: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                alias[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                alias[a.asname or a.name] = full = f"{node.module}.{a.name}"
                found += [f"{node.lineno}: {full}"] if full in MACHINE_READS else []
    for node in ast.walk(tree):
        parts: list[str] = []
        base = node
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in alias:
            name = ".".join([alias[base.id], *parts])
            found += [f"{base.lineno}: {name}"] if name in MACHINE_READS else []
    return sorted(set(found))


def test_the_reader_finds_each_read_in_env_machine():
    reads = {line.split(": ")[1] for line in _machine_reads(READER)}
    assert reads == set(MACHINE_READS)


def test_only_env_machine_reads_the_gpu_torch_cuda_and_triton():
    """One reader: every other module asks `env/machine.py` (torch_version, cuda_version,
    triton_version, gpu_name, gpu_capability), so two records made on one machine name it
    alike."""
    others = {
        str(path.relative_to(PACKAGE)): reads
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != READER and path not in STANDALONE and (reads := _machine_reads(path))
    }
    assert others == {}
