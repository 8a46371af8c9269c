"""How a tuned launch times its configs (`quant/kernels/search.py`), with the timing faked: every
config screened, the fastest few timed again at full length, the fastest of those kept; configs
that cannot launch passed over; the lab switch that times every config at full length."""

import pytest
from _interpreter import require_triton

require_triton()  # CUDA builds of torch ship Triton: skip only on a build without it

from triton.runtime.errors import OutOfResources  # noqa: E402

from quantstudy.env.switches import TUNE_SCREEN  # noqa: E402
from quantstudy.quant.kernels import search  # noqa: E402
from quantstudy.record.errors import UserError  # noqa: E402


def _timings(monkeypatch, screen: dict, full: dict) -> list[tuple[str, str]]:
    """Fake both timers from {config: ms}; a config absent from `screen` cannot launch. Returns
    (round, config) for each timing, in order."""
    timed: list[tuple[str, str]] = []

    def timer(name: str, table: dict):
        def time(fn) -> float:
            config = fn()
            timed.append((name, config))
            if config not in table:
                raise OutOfResources(1 << 20, 1 << 18, f"shared memory ({name})")
            return table[config]

        return time

    monkeypatch.setattr(search, "screen_time", timer("screen", screen))
    monkeypatch.setattr(search, "full_time", timer("full", full))
    monkeypatch.delenv(TUNE_SCREEN, raising=False)
    return timed


def _call(config: str):
    return lambda: config  # a launch that says which config it is


def test_every_config_is_screened_and_the_three_fastest_timed_again(monkeypatch):
    """The screen ranks c before b; the full timing, which decides, finds b faster: b is kept.
    e, slowest on the screen, is never timed at full length."""
    screen = {"a": 3.0, "b": 2.1, "c": 2.0, "d": 2.5, "e": 9.0}
    timed = _timings(monkeypatch, screen, {"a": 3.0, "b": 1.9, "c": 2.0, "d": 2.4, "e": 0.1})
    found = search.fastest(list("abcde"), _call)
    assert found == search.Found("b", screened=5, finalists=3, failed=0)
    assert timed == [("screen", c) for c in "abcde"] + [("full", c) for c in "cbd"]


def test_three_configs_or_fewer_are_timed_at_full_length_only(monkeypatch):
    timed = _timings(monkeypatch, {}, {"a": 2.0, "b": 1.0, "c": 3.0})
    assert search.fastest(list("abc"), _call) == search.Found("b", 0, 3, 0)
    assert [r for r, _ in timed] == ["full"] * 3


def test_a_config_that_cannot_launch_is_passed_over(monkeypatch):
    """d runs out of shared memory on the screen: the finalists are the three that ran."""
    _timings(monkeypatch, {"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.5, "b": 1.0, "c": 3.0})
    assert search.fastest(list("abcd"), _call) == search.Found("b", 4, 3, 1)


def test_where_no_config_can_launch_the_last_rounds_first_error_is_raised(monkeypatch):
    """None runs on the screen: its first error. Screened, but no finalist runs at full
    length: the full round's, not the screen's of a config left out."""
    _timings(monkeypatch, {}, {})
    with pytest.raises(OutOfResources, match=r"shared memory \(screen\)"):
        search.fastest(list("abcd"), _call)
    _timings(monkeypatch, {"b": 1.0, "c": 1.0, "d": 1.0}, {})
    with pytest.raises(OutOfResources, match=r"shared memory \(full\)"):
        search.fastest(list("abcd"), _call)


def test_the_lab_switch_times_every_config_at_full_length(monkeypatch):
    """`QUANTSTUDY_TUNE_SCREEN=0`: the search as it was before the screen, to compare the two;
    a value other than 0 or 1 is one clear line."""
    timed = _timings(monkeypatch, {}, dict(zip("abcde", [3.0, 2.0, 4.0, 5.0, 1.0], strict=True)))
    monkeypatch.setenv(TUNE_SCREEN, "0")
    assert search.fastest(list("abcde"), _call) == search.Found("e", 0, 5, 0)
    assert [r for r, _ in timed] == ["full"] * 5
    monkeypatch.setenv(TUNE_SCREEN, "yes")
    with pytest.raises(UserError, match="QUANTSTUDY_TUNE_SCREEN='yes': give 1"):
        search.fastest(list("abcde"), _call)
