"""A bench record names the lab switches its command ran under (`bench/provenance.py`)."""

from __future__ import annotations

import torch

from quantstudy.bench.provenance import collect_provenance
from quantstudy.env.switches import switches_read


def test_a_lab_switch_set_is_named_in_the_record(monkeypatch):
    monkeypatch.delenv("QUANTSTUDY_GEMM_CONFIGS", raising=False)
    assert collect_provenance(torch.device("cpu"), ["bench"]).lab_switches is None
    monkeypatch.setenv("QUANTSTUDY_GEMM_CONFIGS", "6")
    monkeypatch.setenv("QUANTSTUDY_GIT_COMMIT", "abc")  # not a switch: the commit has its field
    said = collect_provenance(torch.device("cpu"), ["bench"]).lab_switches
    assert said == "QUANTSTUDY_GEMM_CONFIGS=6"
    assert switches_read(said) == {"QUANTSTUDY_GEMM_CONFIGS": "6"} and switches_read(None) == {}
