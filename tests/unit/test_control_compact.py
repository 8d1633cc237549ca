"""The compact control message (taiji.monitor.compact): the sums and per-worker slots give the
statistics of the allgathered rows, and a Job above the threshold (ranks as threads, real gloo
groups) trains with identical replicas and takes the same decisions as below it."""

from __future__ import annotations

import math
import random

import pytest
import torch

import taiji
from taiji.comm.transfer import digest
from taiji.monitor.compact import (
    PER_WORKER,
    SUMS,
    agree_compact,
    compact_above,
    compact_message,
    compact_width,
)
from taiji.monitor.stats import ControlRow, StepStats
from taiji.policies import Policy, SetBatchSize
from taiji_harness.injector import Injector, ThreadCluster, tiny_job_parts

pytestmark = pytest.mark.timeout(120)


def rows(n: int, seed: int, *, unmeasured=(), new=(), stop=()) -> list[ControlRow]:
    """``n`` workers' rows: rank 0 saw the newest version; ``unmeasured`` took no norm, ``new``
    just joined (no previous step's numbers), ``stop`` asked to stop."""
    rng = random.Random(seed)
    out = []
    for r in range(n):
        out.append(
            ControlRow(
                version_seen=7.0 if r == 0 else 6.0,
                stop=float(r in stop),
                local_sqnorm=math.nan if r in unmeasured else rng.uniform(0.1, 10),
                sqnorm_batch=rng.choice([8.0, 4.0]),
                local_batch=float(rng.randint(1, 9)),
                loss_sum=rng.uniform(0, 40),
                compute_seconds=rng.uniform(0.01, 0.1),
                clock=1.7e9 + rng.random() if r == 0 else 0.0,
                decisions=float(rng.getrandbits(52)),
                wall_seconds=rng.uniform(0.02, 0.2),
                previous_global_sqnorm=math.nan if r in new else rng.random(),
                previous_allreduce_wait=math.nan if r in new else rng.uniform(0, 0.01),
                previous_monitor_seconds=math.nan if r in new else rng.uniform(0, 0.003),
            )
        )
    return out


def summed(messages: list[list[float]]) -> list[float]:
    """The sum-allreduce of the messages, added in the order given."""
    total = [0.0] * len(messages[0])
    for m in messages:
        total = [a + b for a, b in zip(total, m)]
    return total


@pytest.mark.parametrize(
    "case", [{}, {"unmeasured": {1, 3}}, {"new": {2}}, {"stop": {4}}, {"unmeasured": set(range(5))}]
)
def test_the_compact_message_gives_the_allgathered_rows_statistics(case):
    n = 5
    mine = rows(n, 3, **case)
    message = summed([compact_message(row, rank, n) for rank, row in enumerate(mine)])
    assert len(message) == compact_width(n) == len(SUMS) + len(PER_WORKER) * n
    # added in rank order, as StepStats.reduce adds them: the very same statistics
    assert agree_compact(message, n) == StepStats.reduce(mine, None)


def test_another_order_of_addition_moves_only_the_last_bits_of_the_sums():
    n = 16
    mine = rows(n, 5, unmeasured={2}, new={9})
    messages = [compact_message(row, rank, n) for rank, row in enumerate(mine)]
    forward, backward = agree_compact(summed(messages), n), agree_compact(summed(messages[::-1]), n)
    # one non-zero addend per slot: the per-worker numbers and rank 0's are exact in any order
    for field in (
        "compute_seconds",
        "wall_seconds",
        "decisions",
        "clock",
        "version_seen",
        "stop",
        "previous_monitor_seconds",
        "previous_global_sqnorm",
        "straggler",
        "global_batch",
    ):
        assert getattr(forward, field) == getattr(backward, field), field
    assert forward.decisions == tuple(r.decisions for r in mine)  # 52-bit fingerprints survive exactly
    for field in ("loss", "small_sqnorm", "small_batch"):
        assert getattr(forward, field) == pytest.approx(getattr(backward, field), rel=1e-14), field
    assert (
        forward.previous_global_sqnorm is forward.previous_allreduce_wait is None
    )  # a worker that just joined has none: the step has none


def test_the_threshold():
    assert not compact_above(64, 0)  # 0: never
    assert not compact_above(31, 32) and compact_above(32, 32) and compact_above(1024, 32)
    assert compact_width(1024) < ControlRow.WIDTH * 1024 / 3


class ByLoss(Policy):
    """Batch sizes decided from the agreed loss: a stand-in for any data-driven policy."""

    def __init__(self):
        self.seen: list[tuple[int, float, int]] = []

    def after_step(self, ctx):
        loss = ctx.metrics.loss
        self.seen.append((ctx.step, loss, ctx.metrics.samples))
        if loss is not None and ctx.step % 3 == 2:
            return SetBatchSize(6 + 3 * (int(loss * 7) % 3))


def run(n: int, compact_at: int, monkeypatch) -> tuple[dict, Injector]:
    monkeypatch.setenv("TAIJI_CONTROL_COMPACT_AT", str(compact_at))
    injector = Injector([])
    cluster = ThreadCluster(n, injector)

    def body(peer):
        model, opt, data = tiny_job_parts(n=60)
        policy = ByLoss()
        job = taiji.Job(
            model,
            opt,
            data,
            6,
            max_steps=12,
            epochs=100,
            peer=peer,
            log_every=0,
            policies=[policy],
            monitor_every=1,
        )
        spans = []
        for step in job:
            x, y = step.batch
            step.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
            spans.append(step.span)
        return {
            "digest": digest(list(model.parameters())),
            "spans": spans,
            "seen": policy.seen,
            "gns": job.stats.small_sqnorm,
        }

    for w in range(n):
        cluster.start(f"w{w}", body)
    return cluster.join(), injector


def test_a_job_above_the_threshold_trains_as_below_it(monkeypatch):
    n = 3
    below, below_calls = run(n, 0, monkeypatch)
    above, above_calls = run(n, 2, monkeypatch)
    for results in (below, above):
        assert len({r["digest"] for r in results.values()}) == 1, "replicas diverged"
        assert len({repr(r["seen"]) for r in results.values()}) == 1, "workers saw different metrics"
    one_below, one_above = below["w0"], above["w0"]
    assert one_above["spans"] == one_below["spans"], "different batch decisions"
    assert len({s[1] - s[0] for s in one_above["spans"]}) > 1, "the policy never changed the batch"
    assert [(s, b) for s, _, b in one_above["seen"]] == [(s, b) for s, _, b in one_below["seen"]]
    for (_, mine, _), (_, theirs, _) in zip(one_above["seen"], one_below["seen"]):
        assert mine == pytest.approx(theirs, rel=1e-6)
    assert one_above["gns"] == pytest.approx(one_below["gns"], rel=1e-5)
    # the compact message went as a ctrl allreduce, every step; below the threshold none did
    assert ctrl_allreduces(above_calls) >= 12 and ctrl_allreduces(below_calls) == 0


def ctrl_allreduces(injector: Injector) -> int:
    return sum(
        n
        for (worker, _, channel, op), n in injector.calls.items()
        if (worker, channel, op) == ("w0", "ctrl", "allreduce")
    )
