"""The interpreter kernel tests skip only where Triton is truly absent (`_interpreter.py`)."""

import builtins
import importlib.metadata

import pytest
from _interpreter import require_triton, torch_declares_triton
from _pytest.outcomes import Failed, Skipped


def _without_triton(monkeypatch, requires):
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("No module named 'triton'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_triton)
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)


def test_a_torch_that_ships_triton_fails_when_triton_does_not_import(monkeypatch):
    _without_triton(monkeypatch, ['triton==3.6.0; platform_system == "Linux"'])
    monkeypatch.setattr("platform.system", lambda: "Linux")
    with pytest.raises(Failed, match="ships Triton but it does not import"):
        require_triton()


def test_a_torch_without_triton_skips_and_says_so(monkeypatch):
    _without_triton(monkeypatch, ["filelock", "sympy>=1.13.3", "jinja2"])
    with pytest.raises(Skipped, match="TRITON ABSENT"):
        require_triton()


def test_the_declaration_follows_its_platform_marker(monkeypatch):
    monkeypatch.setattr(
        importlib.metadata, "requires", lambda name: ['triton==3.6.0; platform_system == "Nope"']
    )
    assert not torch_declares_triton()
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: ["pytorch-triton==3.6.0"])
    assert torch_declares_triton()
