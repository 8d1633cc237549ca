"""IDX reading/writing and the Fashion-MNIST-layout loader, on tiny files the tests write."""

import numpy as np
import pytest
import torch

from taiji import env
from taiji.data.datasets import DatasetMissing, SyntheticImages, load_idx_classification, read_idx, write_idx
from taiji.errors import ConfigError


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("name", ["a.idx", "a.idx.gz"])
def test_idx_round_trip(tmp_path, dtype, name):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / name, array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and np.array_equal(back, array)


def test_truncated_and_bad_magic_files_are_clear_errors(tmp_path):
    path = write_idx(tmp_path / "x.idx", np.zeros((4, 5), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(path)
    (tmp_path / "y.idx").write_bytes(b"PK\x03\x04junk")
    with pytest.raises(ConfigError, match="not an IDX file"):
        read_idx(tmp_path / "y.idx")


def write_split(root, split, n, gz=True):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    write_idx(root / f"{split}-images-idx3-ubyte{suffix}", images)
    write_idx(root / f"{split}-labels-idx1-ubyte{suffix}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_loader_reads_mnist_layout(tmp_path, gz):
    images, labels = write_split(tmp_path, "train", 7, gz)
    write_split(tmp_path, "t10k", 3, gz)
    train = load_idx_classification(tmp_path, train=True, mean=0.0, std=1.0)
    x, y = train.tensors
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.allclose(x[:, 0], torch.from_numpy(images).float() / 255)
    assert y.tolist() == labels.tolist()
    assert len(load_idx_classification(tmp_path, train=False)) == 3


def test_missing_files_say_how_to_get_them(tmp_path):
    with pytest.raises(DatasetMissing, match="apt-get install -y dataset-fashion-mnist"):
        load_idx_classification(tmp_path)


def test_mismatched_images_and_labels(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((3, 28, 28), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(4, np.uint8))
    with pytest.raises(ConfigError, match="do not pair up"):
        load_idx_classification(tmp_path)


def test_synthetic_is_deterministic_and_labelled():
    a, b = SyntheticImages(num_samples=50).build(), SyntheticImages(num_samples=50).build()
    assert torch.equal(a.tensors[0], b.tensors[0]) and a.tensors[1].max() < 10


def test_env_vars_parse_and_reject():
    assert env.TIMEOUT.get({"TAIJI_TIMEOUT": "2.5"}) == 2.5
    assert env.TIMEOUT.get({}) == env.TIMEOUT.default
    assert env.DEBUG_COLLECTIVES.get({"TAIJI_DEBUG_COLLECTIVES": "yes"}) is True
    with pytest.raises(ConfigError, match="TAIJI_TIMEOUT"):
        env.TIMEOUT.get({"TAIJI_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="TAIJI_DEBUG_COLLECTIVES"):
        env.DEBUG_COLLECTIVES.get({"TAIJI_DEBUG_COLLECTIVES": "maybe"})
