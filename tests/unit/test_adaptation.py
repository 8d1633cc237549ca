"""Policies inside the Job (ranks as threads): agreed decisions applied at the same step on every
worker, the decision check and errors. Policies across resizes and failures with real processes:
tests/faults/test_adaptation_faults.py."""

import pytest
import torch
import torch.nn.functional as F

import taiji
from taiji.comm.transfer import digest
from taiji.errors import ConsensusError
from taiji.policies import LinearLRScaling, Policy, PolicyError, SetBatchSize, Stop
from taiji_harness.testing import REPO, classification_data, run_threads

pytestmark = pytest.mark.timeout(120)


def data(n=97):
    return classification_data(n)


class Schedule(Policy):
    """Batch sizes by step, decided in after_step: a stand-in for any data-driven policy."""

    def __init__(self, batches):
        self._batches = batches
        self.changes = 0

    def after_step(self, ctx):
        if ctx.step in self._batches:
            self.changes += 1
            return SetBatchSize(self._batches[ctx.step])


def train(peer, policies, epochs=2, batch=8):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    job = taiji.Job(
        model, opt, data(), batch, epochs=epochs, peer=peer, log_every=0, seed=1, policies=policies
    )
    steps = []
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        steps.append(
            {
                "index": step.index,
                "epoch": step.epoch,
                "span": step.span,
                "local": step.indices.tolist(),
                "lr": opt.param_groups[0]["lr"],
            }
        )
    state = [p.detach() for p in model.parameters()] + [
        opt.state[p]["momentum_buffer"] for p in model.parameters()
    ]
    return steps, digest(state), job


def test_batch_changes_mid_epoch_apply_at_the_same_step_everywhere_and_keep_exactly_once():
    batches = {3: 20, 5: 5, 9: 33}
    results = run_threads(2, lambda peer: train(peer, [Schedule(batches), LinearLRScaling()]))
    (steps0, digest0, job0), (steps1, digest1, _) = results
    assert digest0 == digest1, "replicas differ"
    assert [s["span"] for s in steps0] == [s["span"] for s in steps1]
    sizes = [s["span"][1] - s["span"][0] for s in steps0]
    # 97 samples: 3x8, 2x20, 4x5, then 33 is cut to the 13 left; the next epoch starts with 33
    assert sizes[:11] == [8, 8, 8, 20, 20, 5, 5, 5, 5, 13, 33]
    for epoch in (0, 1):
        consumed = sorted(
            i for s0, s1 in zip(steps0, steps1) if s0["epoch"] == epoch for i in s0["local"] + s1["local"]
        )
        assert consumed == list(range(97)), f"epoch {epoch} is not exactly-once"
    assert steps0[3]["lr"] == pytest.approx(0.1 * 20 / 8) and steps0[9]["lr"] == pytest.approx(0.1 * 33 / 8)
    assert [s["lr"] for s in steps0] == [s["lr"] for s in steps1]
    assert job0.policies[0].changes == 3


def test_workers_that_decide_differently_are_stopped_naming_the_policy_and_step():
    class ByRank(Policy):  # a bug: decides from something that is not in the Context
        def __init__(self, rank):
            self._rank = rank

        def after_step(self, ctx):
            if ctx.step == 4:
                return SetBatchSize(8 + self._rank)

    def body(peer):
        with pytest.raises(ConsensusError) as info:
            train(peer, [LinearLRScaling(), ByRank(peer.rank)])
        return str(info.value)

    for message in run_threads(3, body):
        assert "taken by ByRank (#1).after_step; ranks [1, 2] differ from rank 0" in message
        assert "step=4" in message and "before step 4" in message


def test_a_policy_that_raises_stops_every_worker_with_its_name_and_step():
    class Broken(Policy):
        def after_step(self, ctx):
            if ctx.step == 2:
                raise KeyError("gns")

    def body(peer):
        with pytest.raises(PolicyError, match=r"Broken.after_step raised at step 2 .*KeyError"):
            train(peer, [Broken()])
        return True

    assert run_threads(2, body, join_timeout=30) == [True, True]


def test_stop_decision_ends_training_on_every_worker_at_the_same_step():
    class StopAt(Policy):
        def before_step(self, ctx):
            return Stop("enough") if ctx.step == 6 else None

    results = run_threads(2, lambda peer: train(peer, [StopAt()]))
    assert [r[2].progress.step for r in results] == [6, 6] and results[0][1] == results[1][1]


def test_hooks_run_in_order_with_an_identical_context():
    class Recorder(Policy):
        def __init__(self):
            self._calls = []

        def __getattribute__(self, name):
            if name in (
                "before_train",
                "before_epoch",
                "before_step",
                "after_step",
                "after_epoch",
                "after_train",
            ):
                calls = object.__getattribute__(self, "_calls")
                return lambda ctx: calls.append((name, ctx.step, ctx.epoch, ctx.size, ctx.batch_size))
            return object.__getattribute__(self, name)

    def body(peer):
        recorder = Recorder()
        train(peer, [recorder], epochs=1, batch=40)  # 97 samples: 3 steps
        return recorder._calls

    calls0, calls1 = run_threads(2, body)
    assert calls0 == calls1
    assert [c[0] for c in calls0] == [
        "before_train",
        "before_epoch",
        "before_step",
        "after_step",
        "before_step",
        "after_step",
        "before_step",
        "after_step",
        "after_epoch",
        "after_train",
    ]
    assert [c[1] for c in calls0][:3] == [0, 0, 0] and calls0[-2][1] == 3


def test_the_policies_guide_custom_policy_runs_as_written():
    import re

    guide = (REPO / "docs" / "guides" / "policies.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "DoubleBatchOnPlateau" in b)
    definition = block.split("\njob = ")[0]
    assert len(block.strip().splitlines()) <= 17, "the policies guide promises a ~15-line custom policy"
    namespace: dict = {}
    exec(definition, namespace)
    policy = namespace["DoubleBatchOnPlateau"](every=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the loss plateaus for sure
    job = taiji.Job(
        model,
        opt,
        data(),
        4,
        epochs=1,
        peer=taiji.runtime.peer.Peer.solo(),
        log_every=0,
        policies=[policy, namespace["LRScaling"]("sqrt")],
    )
    batches = []
    for step in job:
        batches.append(step.global_batch_size)
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
    body = batches[:-1]  # the epoch's last step takes what is left
    changes = [(a, b) for a, b in zip(body, body[1:]) if a != b]
    assert batches[:3] == [4, 4, 4] and changes and all(b == 2 * a for a, b in changes), batches
    assert policy.best < float("inf")
