"""Applying a scheduling round to live jobs: shrinks first, grows only into slots that are free
(taiji/sched/rounds.py; pure, no processes). Every scenario audits every instant."""

import random

import pytest

from taiji.errors import ConfigError
from taiji.sched.rounds import Change, Rounds, held, oversubscribed


def audit(rounds, holds):
    """Neither the workers present nor the slots reserved may exceed any host's slots."""
    assert not oversubscribed(rounds.slots, holds), holds
    assert all(n <= cap for n, cap in zip(held(holds, rounds.asked, len(rounds.slots)), rounds.slots))


def test_a_new_job_starts_only_after_the_running_one_gave_its_slots_back():
    rounds = Rounds(slots=(4,), shrink_timeout=30.0)
    holds = {"a": (4,), "b": (0,)}
    assert rounds.start(0.0, holds, {"a": (2,), "b": (2,)}) == [Change("a", (4,), (2,))]
    assert Change("a", (4,), (2,)).kind == "shrink"
    audit(rounds, holds)
    assert rounds.tick(1.0, holds) == [], "b waits while a still runs 4 workers"
    holds["a"] = (2,)
    started = rounds.tick(2.0, holds)
    assert started == [Change("b", (0,), (2,))] and started[0].kind == "start"
    audit(rounds, holds)
    assert not rounds.in_progress and rounds.tick(3.0, holds) == []


def test_a_shrink_that_never_lands_times_out_and_keeps_its_slots():
    rounds = Rounds(slots=(4,), shrink_timeout=5.0)
    holds = {"a": (4,), "b": (0,)}
    rounds.start(0.0, holds, {"a": (2,), "b": (2,)})
    assert rounds.tick(4.9, holds) == []
    assert rounds.tick(5.0, holds) == [] and rounds.deferred == ["b"], "a's 4 slots stay reserved"
    assert rounds.asked["a"].target == (2,)
    audit(rounds, holds)
    holds["a"] = (2,)  # it lands late: the next round may grow b
    assert rounds.start(60.0, holds, {"a": (2,), "b": (2,)}) == [Change("b", (0,), (2,))]
    audit(rounds, holds)


def test_a_grow_reserves_its_slots_before_its_workers_appear():
    rounds = Rounds(slots=(4,))
    holds = {"a": (2,), "b": (0,), "c": (0,)}
    assert rounds.start(0.0, holds, {"b": (2,)}) == [Change("b", (0,), (2,))]
    assert rounds.start(1.0, holds, {"c": (2,)}) == [] and rounds.deferred == ["c"]
    holds["b"] = (2,)
    assert rounds.start(2.0, holds, {"c": (1,)}) == [] and rounds.deferred == ["c"]
    assert rounds.start(2.5, holds, {"c": (1,)}) == []
    del holds["a"]  # a ended: its slots are free at once
    assert rounds.start(3.0, holds, {"c": (2,)}) == [Change("c", (0,), (2,))]
    audit(rounds, holds)


def test_two_jobs_swap_full_hosts_in_two_rounds_without_oversubscribing():
    rounds = Rounds(slots=(2, 2))
    holds = {"a": (2, 0), "b": (0, 2)}
    targets = {"a": (0, 2), "b": (2, 0)}
    # each keeps one worker where it is (a running job never goes to zero) ...
    assert rounds.start(0.0, holds, targets) == [Change("a", (2, 0), (1, 0)), Change("b", (0, 2), (0, 1))]
    holds = {"a": (1, 0), "b": (0, 1)}
    # ... then each moves into the one slot the other freed
    moves = rounds.tick(1.0, holds)
    assert moves == [Change("a", (1, 0), (0, 1)), Change("b", (0, 1), (1, 0))]
    assert {c.kind for c in moves} == {"move"} and rounds.deferred == ["a", "b"]
    audit(rounds, holds)
    holds = {"a": (1, 1), "b": (1, 1)}  # the joiners arrived before the leavers left
    audit(rounds, holds)
    holds = {"a": (0, 1), "b": (1, 0)}
    assert rounds.start(2.0, holds, targets) == [Change("a", (0, 1), (0, 2)), Change("b", (1, 0), (2, 0))]
    holds = {"a": (0, 2), "b": (2, 0)}
    audit(rounds, holds)
    assert rounds.tick(3.0, holds) == [] and rounds.asked == {}, "both asks reached"


def test_a_grow_is_clipped_to_the_free_slots_and_asks_for_the_rest_next_round():
    rounds = Rounds(slots=(4,))
    holds = {"a": (3,), "b": (0,)}
    assert rounds.start(0.0, holds, {"b": (3,)}) == [Change("b", (0,), (1,))] and rounds.deferred == ["b"]
    holds = {"b": (1,)}  # a ended
    assert rounds.start(1.0, holds, {"b": (3,)}) == [Change("b", (1,), (3,))] and rounds.deferred == []


def test_a_job_that_ends_frees_its_slots_and_its_asks():
    rounds = Rounds(slots=(3,))
    holds = {"a": (3,), "b": (0,)}
    rounds.start(0.0, holds, {"a": (1,), "b": (2,)})
    del holds["a"]
    assert rounds.tick(1.0, holds) == [Change("b", (0,), (2,))] and "a" not in rounds.asked


def test_targets_are_validated():
    with pytest.raises(ConfigError):
        Rounds(slots=())
    with pytest.raises(ConfigError):
        Rounds(slots=(2,)).start(0.0, {"a": (1,)}, {"a": (1, 1)})


def test_random_rounds_against_slow_jobs_never_oversubscribe_a_host():
    """Jobs reach their asks one worker per tick, sometimes never; every instant is audited."""
    rng = random.Random(7)
    slots = (3, 2, 4)
    for trial in range(60):
        rounds = Rounds(slots=slots, shrink_timeout=3.0)
        holds = {f"j{i}": (0, 0, 0) for i in range(4)}
        stuck = {job for job in holds if rng.random() < 0.2}
        now = 0.0
        for step in range(40):
            now += 1.0
            if step % 6 == 0:  # a new round: random targets that each fit the cluster on their own
                targets = {job: tuple(rng.randint(0, cap) for cap in slots) for job in holds}
                rounds.start(now, holds, targets)
            else:
                rounds.tick(now, holds)
            for job, ask in rounds.asked.items():  # each job moves one worker towards its ask
                if job in stuck and ask.shrink:
                    continue
                current = list(holds[job])
                for h, (n, t) in enumerate(zip(current, ask.target)):
                    if n != t:
                        current[h] += 1 if t > n else -1
                        break
                holds[job] = tuple(current)
            audit(rounds, holds)
            if step == 20 and trial % 3 == 0:
                holds.pop(rng.choice(sorted(holds)), None)  # a job ends


def test_a_start_clipped_below_the_jobs_minimum_waits():
    rounds = Rounds(slots=(4,))
    holds = {"a": (2,), "c": (0,)}
    assert rounds.start(0.0, holds, {"c": (3,)}, minimum={"c": 3}) == [] and rounds.deferred == ["c"]
    assert rounds.start(1.0, holds, {"c": (2,)}, minimum={"c": 1}) == [Change("c", (0,), (2,))]


def test_an_earlier_grows_slots_stay_reserved_until_the_job_moved_past_the_new_ask():
    rounds = Rounds(slots=(4,))
    holds, versions = {"a": (1,), "b": (0,)}, {"a": 1, "b": 0}
    assert rounds.start(0.0, holds, {"a": (4,)}, versions=versions) == [Change("a", (1,), (4,))]
    # before a's joiners arrive, the next round wants a at 2 and b at 2: one change for a, and b
    # waits, since a's launcher may still bring up the workers it was asked for first
    assert rounds.start(1.0, holds, {"a": (2,), "b": (2,)}, versions=versions) == [Change("a", (1,), (2,))]
    assert rounds.tick(1.5, holds, versions) == [] and held(holds, rounds.asked, 1) == (4,)
    holds, versions = {"a": (2,), "b": (0,)}, {"a": 2, "b": 0}  # a published its new version
    assert rounds.start(2.0, holds, {"a": (2,), "b": (2,)}, versions=versions) == [Change("b", (0,), (2,))]
    audit(rounds, holds)


def test_a_withdrawn_ask_is_asked_again_next_round():
    rounds = Rounds(slots=(4,))
    holds = {"a": (2,)}
    assert rounds.start(0.0, holds, {"a": (4,)}) == [Change("a", (2,), (4,))]
    assert rounds.start(1.0, holds, {"a": (4,)}) == [], "asked already"
    rounds.withdraw("a")  # the request never reached a's launcher
    assert rounds.start(2.0, holds, {"a": (4,)}) == [Change("a", (2,), (4,))]
