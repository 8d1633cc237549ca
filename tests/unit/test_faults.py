"""The declarative fault plan (runtime/faults.py): parsing, matching and what it refuses."""

import json

import pytest

from taiji.errors import CommError, ConfigError
from taiji.runtime.faults import PHASES, Fault, FaultPlan, parse


def test_a_plan_parses_every_phase_and_matches_by_rank_or_worker():
    plan = parse(json.dumps([{"action": "kill", "phase": phase, "step": 3, "rank": 1} for phase in PHASES]))
    assert [f.phase for f in plan] == list(PHASES) and "commit" in PHASES
    assert plan[2].matches("commit", 1, 3, "w1") and not plan[2].matches("commit", 0, 3, "w0")
    assert Fault("hang", "commit", worker="w2").matches("commit", 0, 9, "w2")


def test_raise_at_commit_is_refused_with_what_to_use_instead():
    with pytest.raises(ConfigError, match="no collective is left to fail at 'commit'"):
        parse(json.dumps([{"action": "raise", "phase": "commit"}]))
    with pytest.raises(ConfigError, match="phase in"):
        parse(json.dumps([{"action": "kill", "phase": "later"}]))


def test_a_fault_fires_once_per_job_unless_it_repeats():
    claimed: set[int] = set()

    def claim(i: int) -> bool:
        first = i not in claimed
        claimed.add(i)
        return first

    plan = FaultPlan((Fault("raise", "allreduce", step=2),), claim)
    plan.fire("allreduce", 0, 1, "w0")  # another step: nothing
    with pytest.raises(CommError, match="injected collective failure at step 2"):
        plan.fire("allreduce", 0, 2, "w0")
    plan.fire("allreduce", 1, 2, "w1")  # claimed already: the retry runs clean
    repeat = FaultPlan((Fault("raise", "allreduce", repeat=True),), lambda i: False)
    for rank in (0, 1):
        with pytest.raises(CommError):
            repeat.fire("allreduce", rank, 5, f"w{rank}")
