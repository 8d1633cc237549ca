"""Elastic, exactly-once sampling as pure index arithmetic.

The epoch's order is a function of ``(seed, epoch)``. Step ``s`` consumes the global
slice ``perm[cursor : cursor + B]``; worker ``r`` of ``n`` takes a contiguous share of it
whose size differs from the others' by at most one. ``SamplerState`` (epoch, cursor,
batch size) is all that must be agreed, so no communication is needed to know who
reads what, and a retried step (after a resize or failure) re-splits the same slice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class SamplerState:
    """Where an epoch stands: the epoch, the samples already consumed (``cursor``) and the global
    batch size; part of the synced training state."""

    epoch: int = 0
    cursor: int = 0  # samples of this epoch already consumed (committed)
    batch_size: int = 1  # global batch size B

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"global batch size must be >= 1, got {self.batch_size}")
        if self.epoch < 0 or self.cursor < 0:
            raise ConfigError(f"epoch and cursor must be >= 0, got {self.epoch}, {self.cursor}")


def epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"taiji-sampler:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The order in which epoch ``epoch`` visits the ``num_samples`` indices."""
    if not shuffle:
        return torch.arange(num_samples, dtype=torch.int64)
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(num_samples, generator=generator, dtype=torch.int64)


def global_span(state: SamplerState, num_samples: int) -> tuple[int, int]:
    """Positions ``[lo, hi)`` in the epoch's permutation that the next step consumes.

    The last step of an epoch is shorter when ``B`` does not divide the data set, so
    every sample is consumed exactly once.
    """
    if num_samples < 1:
        raise ConfigError("the data set is empty")
    if state.cursor >= num_samples:
        raise ConfigError(f"cursor {state.cursor} is past the end of a {num_samples}-sample epoch")
    return state.cursor, min(state.cursor + state.batch_size, num_samples)


def shard(lo: int, hi: int, rank: int, size: int) -> tuple[int, int]:
    """Worker ``rank``'s contiguous share of ``[lo, hi)``; shares differ by at most one."""
    if not 0 <= rank < size:
        raise ConfigError(f"rank {rank} is outside a cluster of size {size}")
    total = hi - lo
    base, extra = divmod(total, size)
    start = lo + rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def advance(state: SamplerState, consumed: int, num_samples: int) -> SamplerState:
    """The state after committing a step that consumed ``consumed`` samples."""
    cursor = state.cursor + consumed
    if cursor > num_samples:
        raise ConfigError(f"step consumed past the end of the epoch ({cursor} > {num_samples})")
    if cursor == num_samples:
        return replace(state, epoch=state.epoch + 1, cursor=0)
    return replace(state, cursor=cursor)


class ElasticSampler:
    """Which sample indices each worker reads at each step; stateless apart from its config."""

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True):
        if num_samples < 1:
            raise ConfigError("ElasticSampler needs a non-empty data set")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self._cached_epoch: int | None = None
        self._cached_perm: torch.Tensor | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's order of the sample indices (seeded by ``(seed, epoch)``)."""
        if self._cached_epoch != epoch:
            self._cached_perm = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
            self._cached_epoch = epoch
        assert self._cached_perm is not None
        return self._cached_perm

    def global_indices(self, state: SamplerState) -> torch.Tensor:
        """The next global batch's sample indices, all workers together."""
        lo, hi = global_span(state, self.num_samples)
        return self.permutation(state.epoch)[lo:hi]

    def local_share(self, state: SamplerState, rank: int, size: int) -> tuple[int, int, int]:
        """``(epoch, start, stop)``: worker ``rank``'s positions in the epoch's permutation."""
        return (state.epoch, *shard(*global_span(state, self.num_samples), rank, size))

    def indices_of(self, share: tuple[int, int, int]) -> torch.Tensor:
        """The sample indices of an ``(epoch, start, stop)`` share of a permutation."""
        epoch, start, stop = share
        return self.permutation(epoch)[start:stop]

    def local_indices(self, state: SamplerState, rank: int, size: int) -> torch.Tensor:
        """Worker ``rank`` of ``size``'s contiguous share of the next global batch."""
        return self.indices_of(self.local_share(state, rank, size))

    def steps_per_epoch(self, batch_size: int) -> int:
        """Steps in an epoch at a fixed global batch size (the last one may be short)."""
        return -(-self.num_samples // batch_size)


def position_segments(lo: int, hi: int, num_samples: int) -> list[tuple[int, int, int]]:
    """Global positions ``[lo, hi)`` (epoch·N + offset) as ``(epoch, start, stop)`` pieces of each
    epoch's permutation: decoupled training claims runs of positions that may cross an epoch."""
    if num_samples < 1 or lo < 0 or hi < lo:
        raise ConfigError(f"invalid positions [{lo}, {hi}) of a {num_samples}-sample epoch")
    pieces = []
    while lo < hi:
        epoch, start = divmod(lo, num_samples)
        stop = min(num_samples, start + hi - lo)
        pieces.append((epoch, start, stop))
        lo += stop - start
    return pieces
