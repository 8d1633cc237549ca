"""Every failure path of the runtime's Transitions/StepEngine, with ranks as threads and
injected collective failures (see taiji_harness/injector.py): each runs in well under a second."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import taiji
from taiji.cluster import spec
from taiji.comm.transfer import digest
from taiji.errors import StoreError
from taiji_harness.injector import Inject, Injector, ThreadCluster, WorkerDied, tiny_job_parts

pytestmark = pytest.mark.timeout(60)
BATCH, STEPS = 6, 8
GROWN = 300  # steps of a run that waits for a published change: long enough for it to land


def train(record: dict, steps: int = STEPS, hold=None, **job_kw):
    """A worker's body: a Job over the tiny data set, recording what each committed step trained.
    ``hold(step_index)`` runs after each commit (to keep members training until the test acts)."""

    def body(peer):
        model, opt, data = tiny_job_parts()
        seen = record.setdefault(peer.worker_id, {})

        def committed(step):
            seen[step.index] = (step.indices.tolist(), step.span)
            # which cluster committed it, and whether its control rows brought the shares of |ḡ|²
            record.setdefault("paired", {}).setdefault(peer.worker_id, {})[step.index] = (
                peer.version,
                job.stats.previous_global_sqnorm is not None,
            )
            if hold is not None:
                hold(step.index)

        job = taiji.Job(
            model,
            opt,
            data,
            BATCH,
            max_steps=steps,
            epochs=100,
            peer=peer,
            log_every=0,
            recovery_timeout=job_kw.pop("recovery_timeout", 5.0),
            on_commit=committed,
            **job_kw,
        )
        for step in job:
            x, y = step.batch
            step.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
        return {
            "digest": digest(
                list(model.parameters())
                + [s for st in opt.state.values() for s in st.values() if torch.is_tensor(s)]
            ),
            "step": job.progress.step,
            "transitions": job.transitions,
            "params": [p.detach().clone() for p in model.parameters()],
        }

    return body


def solo_params(steps: int) -> list[torch.Tensor]:
    """The uninterrupted one-worker trajectory the survivors must reproduce (same global batches)."""
    from taiji.runtime.peer import Peer

    return train({}, steps=steps)(Peer.solo())["params"]


def check_invariants(results: dict, record: dict, survivors: list[str], steps: int = STEPS) -> None:
    """Survivors hold identical replicas at the same step; every committed step's global batch
    was trained exactly once across the workers of the version that committed it."""
    finals = [results[w] for w in survivors]
    assert {r["step"] for r in finals} == {steps}
    assert len({r["digest"] for r in finals}) == 1, "replicas diverged"
    for mine, reference in zip(finals[0]["params"], solo_params(steps)):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6, msg="left the 1-worker trajectory")
    for index in range(steps):
        spans = {seen[index][1] for seen in record.values() if index in seen}
        assert len(spans) == 1, f"step {index} committed with different spans {spans}"
        lo, hi = spans.pop()
        trained = sorted(i for seen in record.values() if index in seen for i in seen[index][0])
        assert len(trained) == len(set(trained)) == hi - lo, f"step {index}: {trained} is not its span once"


def until_version(cluster, version: int, at_step: int):
    """A ``hold`` that keeps a worker at ``at_step`` until the test publishes ``version``. (The
    workers notice a new version within the watcher's poll interval: a run must last longer than
    that after the hold, or it may end before the change lands.)"""

    def hold(index: int) -> None:
        if index == at_step:
            cluster.store.wait_for_version(version, 20)

    return hold


def lose_everywhere(
    dead: str, others: list[str], version: int, channel: str, op: str, nth: int
) -> list[Inject]:
    return [Inject(dead, version, channel, op, nth, "die")] + [
        Inject(w, version, channel, op, nth, "lose") for w in others
    ]


def test_peer_lost_mid_allreduce_recovers_and_retries_the_step():
    injector = Injector(lose_everywhere("w2", ["w0", "w1"], 1, "grad", "allreduce", 4))
    cluster, record = ThreadCluster(3, injector), {}
    for w in ("w0", "w1", "w2"):
        cluster.start(w, train(record))
    cluster.launcher()
    results = cluster.join()
    assert cluster.died == {"w2"} and len(injector.fired) == 3
    check_invariants(results, record, ["w0", "w1"])
    change = results["w0"]["transitions"][0]
    assert (change["reason"], change["from_size"], change["to_size"], change["step"]) == ("failure", 3, 2, 3)
    assert 3 not in record["w2"], "the failed step was committed by the dead worker"


@pytest.mark.parametrize("sent", ["carried", "own", "compact"])
def test_timeout_in_the_control_message_recovers(sent, monkeypatch):
    # SyncSGD's last bucket carries the control rows: the step's one collective times out; a
    # strategy that cannot carry them sends them in an allgather of their own, which times out;
    # from TAIJI_CONTROL_COMPACT_AT workers on, the compact message's allreduce times out
    if sent == "own":
        monkeypatch.setattr(taiji.SyncSGD, "carry", lambda self, width, row_of: False)
    if sent == "compact":
        monkeypatch.setenv("TAIJI_CONTROL_COMPACT_AT", "2")
    channel, op = {
        "carried": ("grad", "allreduce"),
        "own": ("ctrl", "allgather"),
        "compact": ("ctrl", "allreduce"),
    }[sent]
    injector = Injector([Inject("w1", 1, channel, op, 3, "die"), Inject("w0", 1, channel, op, 3, "timeout")])
    cluster, record = ThreadCluster(2, injector), {}
    for w in ("w0", "w1"):
        cluster.start(w, train(record))
    cluster.launcher()
    results = cluster.join()
    check_invariants(results, record, ["w0"])
    assert results["w0"]["transitions"][0]["to_size"] == 1


def test_failure_during_state_sync_is_a_second_recovery():
    # w3 dies at step 2 (v1); while the survivors sync on v2, w2 dies too: they recover again on v3
    injector = Injector(
        lose_everywhere("w3", ["w0", "w1", "w2"], 1, "grad", "allreduce", 3)
        + lose_everywhere("w2", ["w0", "w1"], 2, "ctrl", "allgather", 1)
    )
    cluster, record = ThreadCluster(4, injector), {}
    for w in ("w0", "w1", "w2", "w3"):
        cluster.start(w, train(record))
    cluster.launcher()
    results = cluster.join()
    assert cluster.died == {"w2", "w3"}
    check_invariants(results, record, ["w0", "w1"])
    assert [t["to_version"] for t in results["w0"]["transitions"]] == [
        3
    ]  # v2's sync failed: straight on to v3


def test_second_failure_while_retrying_the_failed_step():
    # w2 dies at step 4 (v1); on v2 the retried step 4 loses w1 as well: w0 finishes alone
    injector = Injector(
        lose_everywhere("w2", ["w0", "w1"], 1, "grad", "allreduce", 5)
        + lose_everywhere("w1", ["w0"], 2, "grad", "allreduce", 1)
    )
    cluster, record = ThreadCluster(3, injector), {}
    for w in ("w0", "w1", "w2"):
        cluster.start(w, train(record))
    cluster.launcher()
    results = cluster.join()
    check_invariants(results, record, ["w0"])
    assert [(t["from_size"], t["to_size"], t["step"]) for t in results["w0"]["transitions"]] == [
        (3, 2, 4),
        (2, 1, 4),
    ]


def test_failure_during_a_grow_transition_recovers_with_the_joiner():
    # a joiner is admitted at v2; a member dies in v2's state sync: the rest (joiner included) go on at v3
    injector = Injector(lose_everywhere("w1", ["w0", "w2"], 2, "ctrl", "allgather", 1))
    cluster, record = ThreadCluster(2, injector), {}
    until_grown = until_version(cluster, 2, at_step=4)
    for w in ("w0", "w1"):
        cluster.start(w, train(record, steps=GROWN, hold=until_grown))
    cluster.start("w2", train(record, steps=GROWN), member=False)
    cluster.store.wait_for_version(1, 5)
    cluster.kv.wait([cluster.store.key("worker/w2/ready")], __import__("datetime").timedelta(seconds=10))
    cluster.launcher()
    from taiji.cluster import spec

    cluster.publish(spec.grow(cluster.config, [spec.WorkerSpec("w2")]))
    results = cluster.join()
    assert cluster.died == {"w1"}
    check_invariants(results, record, ["w0", "w2"], steps=GROWN)


def test_no_new_config_within_the_recovery_timeout_is_a_clear_error():
    # below --min-np with no replacement: nobody publishes; the survivor must not hang
    injector = Injector(lose_everywhere("w1", ["w0"], 1, "grad", "allreduce", 2))
    cluster, record = ThreadCluster(2, injector), {}
    for w in ("w0", "w1"):
        cluster.start(w, train(record, recovery_timeout=0.3))
    with pytest.raises(AssertionError) as failure:
        cluster.join()
    assert "StoreError" in str(failure.value) and "no new cluster config within 0.3s" in str(failure.value)
    assert StoreError.__name__ in str(failure.value)


def test_a_worker_left_out_of_a_shrink_exits_0_at_the_boundary():
    cluster, record = ThreadCluster(3), {}
    until_shrunk = until_version(cluster, 2, at_step=4)
    for w in ("w0", "w1", "w2"):
        cluster.start(w, train(record, steps=GROWN, hold=until_shrunk))
    cluster.store.wait_for_version(1, 5)
    from taiji.cluster import spec

    cluster.publish(spec.shrink(cluster.config, 2))
    results = cluster.join()
    assert results["w2"] == ("exit", 0)
    paired = record.pop("paired")
    check_invariants(results, record, ["w0", "w1"], steps=GROWN)
    # the averaged norm's shares reach only the cluster they were measured in: none in the first
    # step after the shrink (its workers' shares split |ḡ|² three ways), then every step again
    for worker in ("w0", "w1"):
        steps = sorted(paired[worker].items())
        first_of_v2 = next(index for index, (version, _) in steps if version == 2)
        assert [index for index, (_, has) in steps if not has] == [0, first_of_v2], steps


def test_batchnorm_buffers_stay_identical_and_a_failed_attempt_leaves_them_untouched():
    """Running statistics are averaged every step (replicas identical after every commit); the
    forward of a failed attempt updated them, so they are put back before the retry."""
    from taiji.comm.transfer import digest as tensor_hash

    def body(peer):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        _, _, data = tiny_job_parts()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        hashes, at_step_3 = {}, []
        job = taiji.Job(
            model,
            opt,
            data,
            BATCH,
            max_steps=STEPS,
            epochs=100,
            peer=peer,
            log_every=0,
            recovery_timeout=5.0,
            on_commit=lambda step: hashes.__setitem__(
                step.index, tensor_hash(list(model.buffers()) + list(model.parameters()))
            ),
        )
        for step in job:
            if step.index == 3:  # its first attempt fails: the retry must start from the same statistics
                at_step_3.append(tensor_hash(list(model.buffers())))
            x, y = step.batch
            step.backward(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
        return hashes, at_step_3, [b.clone() for b in model.buffers()]

    # three allreduces on "grad" per step (the gradient bucket, the float and the integer
    # buffers): the 10th is step 3's gradient bucket
    injector = Injector(lose_everywhere("w2", ["w0", "w1"], 1, "grad", "allreduce", 10))
    cluster = ThreadCluster(3, injector)
    for w in ("w0", "w1", "w2"):
        cluster.start(w, body)
    cluster.launcher()
    results = cluster.join()
    (h0, at_step_3, buffers0), (h1, _, _) = results["w0"], results["w1"]
    assert h0 == h1 and len(h0) == STEPS, "replicas' buffers or parameters differ after a committed step"
    assert len(at_step_3) == 2 and at_step_3[0] == at_step_3[1], (
        "the failed attempt's forward leaked into the retry"
    )
    assert float(buffers0[0].abs().sum()) > 0, "the running mean never moved: the test measures nothing"


def test_a_worker_whose_attempt_failed_adopts_the_step_its_peers_committed(tmp_path):
    """The split commit: w1 and w2 complete step 5's collectives and commit it, while w0 (the lead,
    which writes the run log) is told its attempt failed after the last bucket; w1 and w2 then fail
    in step 6. After the sync w0 holds step 5's commit: it adopts it — on_commit fires for it, its
    run log has the row, its progress counts it — exactly as on its peers."""
    injector = Injector(
        [
            Inject("w0", 1, "grad", "allreduce", 6, "lose_after"),
            Inject("w1", 1, "grad", "allreduce", 7, "lose"),
            Inject("w2", 1, "grad", "allreduce", 7, "lose"),
        ]
    )
    cluster, record = ThreadCluster(3, injector), {}
    for w in ("w0", "w1", "w2"):
        cluster.start(w, train(record, steps=10, run_dir=str(tmp_path)))
    cluster.launcher()
    results = cluster.join()
    assert len(injector.fired) == 3 and not cluster.died
    record.pop("paired")
    assert sorted(record["w0"]) == list(range(10)), "on_commit did not fire for the adopted step"
    check_invariants(results, record, ["w0", "w1", "w2"], steps=10)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] in (4, 5, 6)] == [4, 5, 6], (
        "the run log skips the adopted step"
    )
    assert [t["reason"] for t in results["w0"]["transitions"]] == ["failure"]


def test_a_version_that_lost_a_member_is_abandoned_at_once_not_at_the_collective_timeout():
    """w2 is cut off inside step 4 (alive, never in its collectives) and a new version drops it as
    lost: w0 and w1, waiting in step 4's allreduce, learn it from the version and recover at once,
    not when their 30 s collective timeout expires."""
    cluster, record = ThreadCluster(3, timeout=30.0), {}
    frozen, cut = threading.Event(), threading.Event()

    def freeze(index: int) -> None:
        if index == 3:
            frozen.set()
            cut.wait(60)
            raise WorkerDied("w2 was cut off")

    cluster.start("w0", train(record, steps=12, hold=lambda index: index == 11 and cut.set()))
    cluster.start("w1", train(record, steps=12))
    cluster.start("w2", train(record, steps=12, hold=freeze))
    try:
        assert frozen.wait(30)
        cluster.publish(spec.remove(cluster.config, ["w2"], lost=True))
        results = cluster.join(timeout=25)
    finally:
        cut.set()
    record.pop("paired")
    check_invariants(results, record, ["w0", "w1"], steps=12)
    [change] = results["w0"]["transitions"]
    assert (change["reason"], change["from_size"], change["to_size"], change["step"]) == ("failure", 3, 2, 4)
    assert change["total_s"] < 5.0, change  # the time training stood still, far below the 30 s timeout
    # where it went, phase by phase, adding up to it: the groups of the new version are built
    # inside the recovery (its first step does not pay them after the recovery was recorded)
    assert list(change["phases"]) == ["failed", "config", "switch", "groups", "sync"], change
    assert sum(change["phases"].values()) == pytest.approx(change["total_s"], abs=1e-6), change
