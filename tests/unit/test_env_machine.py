"""Which GPU, torch and Triton the process runs on (`env/machine.py`), read once for every record
and cache: a study's environment (with its Triton since schema 25), a bench record's provenance,
the kernel choice's cache key and a package's bound machine name them alike."""

from __future__ import annotations

import importlib.util

import torch

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
