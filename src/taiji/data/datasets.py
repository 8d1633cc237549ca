"""Real data sets from standard files, and small synthetic stand-ins.

IDX is the format of MNIST and Fashion-MNIST (the Debian package ``dataset-fashion-mnist``
installs the real files under ``/usr/share/datasets/fashion-mnist/``). Files may be
gzip-compressed. ``write_idx`` exists so tests can write tiny files of their own.
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import ConfigError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FASHION_MEAN, _FASHION_STD = 0.2860, 0.3530

_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(">i2"): 0x0B,
    np.dtype(">i4"): 0x0C,
    np.dtype(">f4"): 0x0D,
    np.dtype(">f8"): 0x0E,
}


class DatasetMissing(ConfigError, FileNotFoundError):
    """A real data set's files are not where we looked."""


def _open(path: Path):
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array."""
    path = Path(path)
    with _open(path) as f:
        header = f.read(4)
        if len(header) != 4 or header[0] != 0 or header[1] != 0:
            raise ConfigError(f"{path} is not an IDX file (bad magic number {header!r})")
        type_code, ndim = header[2], header[3]
        if type_code not in _IDX_DTYPES:
            raise ConfigError(f"{path}: unknown IDX element type 0x{type_code:02x}")
        dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
        dtype = _IDX_DTYPES[type_code]
        expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        payload = f.read()
    if len(payload) != expected:
        raise ConfigError(
            f"{path}: IDX header promises {dims} ({expected} bytes) "
            f"but the file holds {len(payload)} bytes; it is truncated or corrupt"
        )
    return np.frombuffer(payload, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file (gzip if the name ends in .gz or ``compress``)."""
    path = Path(path)
    big_endian = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    if big_endian not in _IDX_CODES:
        raise ConfigError(f"IDX cannot store dtype {array.dtype}")
    header = bytes([0, 0, _IDX_CODES[big_endian], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + np.ascontiguousarray(array, dtype=big_endian).tobytes()
    gz = path.suffix == ".gz" if compress is None else compress
    with gzip.open(path, "wb") if gz else open(path, "wb") as f:
        f.write(data)
    return path


def _find(root: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem, stem.replace("-idx", ".idx")):
        candidate = root / name
        if candidate.exists():
            return candidate
    return None


def load_idx_classification(
    root: str | os.PathLike, train: bool = True, *, mean: float = _FASHION_MEAN, std: float = _FASHION_STD
) -> TensorDataset:
    """MNIST-layout image classification files -> ``TensorDataset(images, labels)``.

    Images become float32 ``(N, 1, H, W)``, normalised by ``mean``/``std``; labels int64.
    """
    root = Path(root)
    split = "train" if train else "t10k"
    images_path = _find(root, f"{split}-images-idx3-ubyte")
    labels_path = _find(root, f"{split}-labels-idx1-ubyte")
    if images_path is None or labels_path is None:
        raise DatasetMissing(
            f"no {split} IDX files in {root} (expected {split}-images-idx3-ubyte[.gz] and "
            f"{split}-labels-idx1-ubyte[.gz]). For Fashion-MNIST on Debian/Ubuntu: "
            "`apt-get install -y dataset-fashion-mnist`."
        )
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ConfigError(f"{root}: images {images.shape} and labels {labels.shape} do not pair up")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - mean) / std
    y = torch.from_numpy(labels.astype(np.int64))
    return TensorDataset(x, y)


def load_fashion_mnist(root: str | os.PathLike | None = None, train: bool = True) -> TensorDataset:
    """Fashion-MNIST as a normalised ``TensorDataset`` (``train=False``: the test split), from
    ``root`` or the Debian package's directory; raises ``DatasetMissing`` naming the package if absent."""
    return load_idx_classification(FASHION_MNIST_DIR if root is None else root, train)


@dataclass(frozen=True)
class SyntheticImages:
    """A learnable stand-in for Fashion-MNIST: one noisy template per class."""

    num_samples: int = 6000
    num_classes: int = 10
    size: int = 28
    noise: float = 0.6
    seed: int = 0

    def build(self) -> TensorDataset:
        g = torch.Generator().manual_seed(self.seed)
        templates = torch.randn(self.num_classes, 1, self.size, self.size, generator=g)
        labels = torch.randint(0, self.num_classes, (self.num_samples,), generator=g)
        noise = torch.randn(self.num_samples, 1, self.size, self.size, generator=g) * self.noise
        return TensorDataset(templates[labels] + noise, labels)
