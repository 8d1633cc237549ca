"""BatchFetcher: batches from a data set, and a batch loaded ahead that is used only for its key."""

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from taiji.data.fetch import BatchFetcher


class Recording(Dataset):
    """Item i is (i, i % 2); remembers what was loaded, and fails on the indices in ``broken``."""

    def __init__(self, n: int, broken: tuple[int, ...] = ()):
        self.n, self.broken, self.loaded = n, broken, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.broken:
            raise IndexError(f"sample {i} is broken")
        self.loaded.append(i)
        return torch.tensor(float(i)), i % 2


def test_a_batch_loaded_ahead_is_used_for_its_key_and_only_once():
    data = Recording(10)
    fetch = BatchFetcher(data)
    fetch.fetch_ahead((0, 2, 4), torch.tensor([2, 3]))
    x, y = fetch(torch.tensor([2, 3]), key=(0, 2, 4))
    assert x.tolist() == [2.0, 3.0] and y.tolist() == [0, 1]
    assert data.loaded == [2, 3] and (fetch.ahead_used, fetch.ahead_dropped) == (1, 0)
    fetch(torch.tensor([2, 3]), key=(0, 2, 4))  # nothing ahead any more: loaded again
    assert data.loaded == [2, 3, 2, 3]


def test_a_wrong_guess_is_dropped_and_the_asked_batch_loaded():
    data = Recording(10)
    fetch = BatchFetcher(data)
    fetch.fetch_ahead((0, 2, 4), torch.tensor([2, 3]))
    x, _ = fetch(torch.tensor([2, 3, 4]), key=(0, 2, 5))  # the batch grew at the boundary
    assert x.tolist() == [2.0, 3.0, 4.0] and (fetch.ahead_used, fetch.ahead_dropped) == (0, 1)
    fetch.fetch_ahead((0, 5, 6), torch.tensor([5]))
    assert fetch(torch.tensor([5])) is not None and fetch.ahead_dropped == 2  # no key: never the guess


def test_a_failing_guess_raises_only_when_the_batch_is_asked_for():
    fetch = BatchFetcher(Recording(10, broken=(7,)))
    fetch.fetch_ahead((0, 6, 8), torch.tensor([6, 7]))  # must not fail the step in flight
    with pytest.raises(IndexError, match="sample 7"):
        fetch(torch.tensor([6, 7]), key=(0, 6, 8))


def test_tensor_data_sets_are_indexed_per_tensor():
    data = TensorDataset(torch.arange(6.0), torch.arange(6) % 3)
    x, y = BatchFetcher(data)(torch.tensor([4, 1]))
    assert x.tolist() == [4.0, 1.0] and y.tolist() == [1, 1]


def test_a_batch_loaded_ahead_stays_on_the_host_until_asked_for(monkeypatch):
    import taiji.data.fetch as fetch_module

    moved = []
    monkeypatch.setattr(fetch_module, "to_device", lambda batch, device: moved.append(device) or batch)
    fetch = BatchFetcher(TensorDataset(torch.arange(4.0)), device="meta")
    fetch.fetch_ahead((0, 0, 2), torch.tensor([0, 1]))
    assert moved == [], "moved to the device in the loader's context, not the asker's"
    fetch(torch.tensor([0, 1]), key=(0, 0, 2))
    assert moved == [torch.device("meta")]


def test_drop_ahead_forgets_the_guess():
    data = Recording(4)
    fetch = BatchFetcher(data)
    fetch.fetch_ahead((0, 0, 2), torch.tensor([0, 1]))
    fetch.drop_ahead()
    fetch(torch.tensor([0, 1]), key=(0, 0, 2))
    assert data.loaded == [0, 1, 0, 1] and fetch.ahead_dropped == 1
