"""The Job loop on one worker (no launcher) and its edge cases."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

import taiji
from taiji.errors import ConfigError
from taiji.runtime.peer import Peer


class ListDataset(Dataset):
    def __init__(self, n):
        self.items = [(torch.full((2,), float(i)), i % 2) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def make(dataset, batch, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, taiji.Job(model, opt, dataset, batch, peer=Peer.solo(), log_every=0, **kw)


def test_epochs_consume_every_sample_once_with_generic_dataset():
    model, _, job = make(ListDataset(11), 4, epochs=2)
    seen = {0: [], 1: []}
    for step in job:
        x, y = step.batch
        assert x.shape == (len(step.indices), 2) and torch.equal(x[:, 0].long(), step.indices)
        seen[step.epoch] += step.indices.tolist()
        step.backward(F.cross_entropy(model(x), y))
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(11))
    assert seen[0] != seen[1], "each epoch is reshuffled"
    assert job.progress.step == 6 and job.progress.epoch == 2


def test_user_may_call_loss_backward_directly_and_scheduler_steps_after_optimizer():
    data = TensorDataset(torch.randn(16, 2), torch.randint(0, 2, (16,)))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    job = taiji.Job(model, opt, data, 4, peer=Peer.solo(), lr_scheduler=sched, log_every=0)
    before = model.weight.detach().clone()
    for step in job:
        x, y = step.batch
        F.cross_entropy(model(x), y).backward()
    assert not torch.equal(before, model.weight)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)


def test_breaking_out_does_not_commit_the_unfinished_step():
    data = TensorDataset(torch.randn(16, 2), torch.randint(0, 2, (16,)))
    model, _, job = make(data, 4)
    for step in job:
        if step.index == 2:
            break
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
    assert job.progress.step == 2 and job.progress.sampler.cursor == 8
    with pytest.raises(ConfigError, match="iterated once"):
        next(iter(job))


def test_max_steps_and_invalid_arguments():
    data = TensorDataset(torch.randn(8, 2), torch.zeros(8, dtype=torch.long))
    _, _, job = make(data, 3, max_steps=2)
    assert sum(1 for step in job if step.backward(torch.zeros((), requires_grad=True)) is None) == 2
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError):
        taiji.Job(model, opt, data, 0, peer=Peer.solo())
    with pytest.raises(ConfigError):
        taiji.Job(torch.nn.Linear(2, 2), opt, data, 2, epochs=0, peer=Peer.solo())


def test_solo_init_outside_a_launcher(monkeypatch):
    monkeypatch.delenv("TAIJI_STORE_PORT", raising=False)
    taiji.shutdown()
    peer = taiji.init()
    try:
        assert (taiji.rank(), taiji.size(), taiji.version()) == (0, 1, 1)
        assert taiji.init() is peer
        t = torch.tensor([2.0])
        assert taiji.allreduce(t, "avg").item() == 2.0
    finally:
        taiji.shutdown()


def test_one_job_per_epoch_releases_the_model_each_time():
    """A pattern users bring from their own loops: a finished Job detaches from the model, so the
    next Job on the same model works; a Job closed early (context manager) too."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8, 2), torch.randint(0, 2, (8,)))
    for _ in range(3):
        job = taiji.Job(model, opt, data, 4, peer=Peer.solo(), log_every=0)
        for step in job:
            x, y = step.batch
            step.backward(F.cross_entropy(model(x), y))
        assert job.progress.step == 2
    with taiji.Job(model, opt, data, 4, peer=Peer.solo(), log_every=0) as job:
        pass  # never iterated: leaving the block releases the model
    taiji.SyncSGD().attach(model, Peer.solo().comm).detach()


def test_pause_keeps_rank_local_work_out_of_the_step_clock():
    model, opt, job = make(TensorDataset(torch.randn(16, 2), torch.randint(0, 2, (16,))), 4)
    walls = []
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        if step.index == 1:
            with job.pause():
                import time

                time.sleep(0.3)  # stands in for an evaluation
        walls.append(job.stats.wall_seconds[0] if job.stats else None)
    # the step after the pause reports no wall time (a fresh clock), not the 0.3 s pause
    assert walls[2] < 0.2


class CountingDataset(ListDataset):
    def __init__(self, n):
        super().__init__(n)
        self.loads = 0

    def __getitem__(self, i):
        self.loads += 1
        return super().__getitem__(i)


def test_each_sample_is_loaded_once_the_batch_loaded_ahead_is_the_one_trained():
    # the next step's batch is loaded while this step's allreduce is in flight; it must be the
    # batch the next step asks for (else every sample would be loaded twice)
    data = CountingDataset(11)
    model, _, job = make(data, 4, epochs=2)
    trained = 0
    for step in job:
        x, y = step.batch
        assert torch.equal(x[:, 0].long(), step.indices)
        trained += len(step.indices)
        step.backward(F.cross_entropy(model(x), y))
    assert trained == 22 and data.loads == trained, (
        "a sample loaded twice: the batch loaded ahead was not used"
    )


def test_nothing_is_loaded_ahead_across_an_epochs_end():
    # users change their data set between epochs (augmentation): the new epoch's first batch is
    # loaded after the boundary, not during the last step of the old epoch
    data = CountingDataset(8)
    model, _, job = make(data, 4, epochs=2)
    loaded_by_backward = []
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        loaded_by_backward.append(data.loads)
    assert loaded_by_backward == [8, 8, 16, 16], (
        "each epoch's second batch ahead, never the next epoch's first"
    )


def test_no_batch_is_loaded_ahead_for_the_step_after_max_steps():
    data = CountingDataset(40)
    model, _, job = make(data, 4, epochs=1, max_steps=3)
    loaded_by_backward = []
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        loaded_by_backward.append(data.loads)
    assert loaded_by_backward == [8, 12, 12], "the last step's backward loaded a batch no step will train"


def test_a_guess_the_boundary_changes_is_dropped_and_the_right_batch_trained():
    from taiji.policies.base import Policy, SetBatchSize

    class SmallerAfterStep1(Policy):
        def after_step(self, ctx):
            return SetBatchSize(3) if ctx.step == 2 else None  # ctx.step: steps committed so far

    data = CountingDataset(23)
    model, _, job = make(data, 4, epochs=1, policies=[SmallerAfterStep1()])
    trained = []
    for step in job:
        x, y = step.batch
        assert torch.equal(x[:, 0].long(), step.indices), "a step trained a batch that is not its own"
        trained += step.indices.tolist()
        step.backward(F.cross_entropy(model(x), y))
    assert sorted(trained) == list(range(23))
    assert data.loads == 23 + 4, "only the one guess made for batch 4 was wasted"


def test_load_ahead_off_loads_each_batch_when_its_step_begins():
    data = CountingDataset(8)
    model, _, job = make(data, 4, epochs=1, load_ahead=False)
    loaded_by_backward = []
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
        loaded_by_backward.append(data.loads)
    assert loaded_by_backward == [4, 8]


def test_options_in_groups_and_old_keywords_warn_naming_their_new_place():
    data = TensorDataset(torch.randn(8, 2), torch.randint(0, 2, (8,)))

    def order(**kw):
        model = torch.nn.Linear(2, 2)
        job = taiji.Job(model, torch.optim.SGD(model.parameters(), lr=0.1), data, 4, peer=Peer.solo(), **kw)
        return [step.indices.tolist() for step in job]

    grouped = order(data=taiji.DataOptions(shuffle=False), monitoring=taiji.MonitorOptions(log_every=0))
    assert grouped == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.warns(
        DeprecationWarning, match=r"Job\(shuffle=\.\.\.\).*data=taiji\.DataOptions\(shuffle=\.\.\.\)"
    ):
        assert order(shuffle=False, monitoring=taiji.MonitorOptions(log_every=0)) == grouped
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        order(shufle=False)
