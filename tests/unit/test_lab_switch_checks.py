"""`quant/kernels/switches.py`: every lab switch has its own code's check, and a junk value of
any of them is refused in one line where it is checked, not only where a GPU kernel reads it."""

from __future__ import annotations

import pytest

from quantstudy.env.switches import FP8_PROMOTE, GELU_ERF, GEMM_CONFIGS, LAB_SWITCHES, TUNE_SCREEN
from quantstudy.quant.kernels.switches import CHECKS, check_lab_switches
from quantstudy.record.errors import UserError

JUNK = {GEMM_CONFIGS: "lots", FP8_PROMOTE: "100", TUNE_SCREEN: "yes", GELU_ERF: "fast"}
GOOD = {GEMM_CONFIGS: "4", FP8_PROMOTE: "0", TUNE_SCREEN: "0", GELU_ERF: "exact"}


def test_every_lab_switch_has_its_check():
    assert set(CHECKS) == set(LAB_SWITCHES) == set(JUNK) == set(GOOD)


@pytest.fixture
def no_switches(monkeypatch):
    for name in LAB_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", sorted(JUNK))
def test_a_junk_value_is_refused_in_one_line_naming_the_switch(no_switches, name):
    no_switches.setenv(name, JUNK[name])
    with pytest.raises(UserError) as refused:
        check_lab_switches()
    said = str(refused.value)
    assert said.startswith(f"{name}={JUNK[name]!r}: give ") and "\n" not in said


def test_values_the_code_takes_pass_and_no_switch_checks_nothing(no_switches):
    check_lab_switches()  # none set
    for name, value in GOOD.items():
        no_switches.setenv(name, value)
    check_lab_switches()
