"""PhaseClock: the seconds between a change's named marks (runtime/phases.py)."""

import time

import pytest

from taiji.runtime.phases import PhaseClock


def test_phases_are_the_seconds_between_marks_and_add_up_to_the_whole():
    started = time.perf_counter() - 0.5  # the failed attempt began half a second ago
    phases = PhaseClock(started)
    phases.mark("failed")
    first = dict(phases.seconds)
    phases.mark("config")
    phases.mark("groups")
    phases.mark("groups")  # marked again (a sync retried): added to the same phase
    assert list(phases.seconds) == ["failed", "config", "groups"]
    assert first["failed"] >= 0.5
    assert sum(phases.seconds.values()) == pytest.approx(phases.last - started, abs=1e-9)
    assert all(seconds >= 0 for seconds in phases.seconds.values())
    assert set(phases.rounded()) == set(phases.seconds) and str(phases).startswith("failed ")
