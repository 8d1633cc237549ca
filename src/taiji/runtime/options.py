"""The Job's options: what to train (``TrainingOptions``, checked once) and how, in four groups with
defaults — data loading, monitoring, fault handling, synchronisation — so the common case stays
``taiji.Job(model, opt, data, batch_size=128, epochs=2)``::

    taiji.Job(model, opt, data, batch_size=128, data=taiji.DataOptions(seed=1, device="cuda"),
              monitoring=taiji.MonitorOptions(every="auto", run_dir="runs/a"),
              faults=taiji.FaultOptions(checkpoint=taiji.Checkpoint("ck", steps=500)))

The keywords these groups replaced (``seed=``, ``log_every=``, ``checkpoint=``, ...) are still
accepted for one release, with a DeprecationWarning naming the new place (``grouped``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch

    from ..checkpoint.config import Checkpoint
    from ..strategies.base import Strategy


@dataclass(frozen=True)
class DataOptions:
    """How the Job reads the data set."""

    seed: int = 0  # the shuffle's seed (every worker's permutation)
    shuffle: bool = True  # a new permutation every epoch
    collate_fn: Callable[[list], Any] | None = None  # items -> batch (default: torch's)
    device: torch.device | str | None = None  # where batches go (None: where the items are)
    load_ahead: bool = True  # load the next batch during the allreduce


@dataclass(frozen=True)
class MonitorOptions:
    """What the Job measures inside the step, and where it says so."""

    every: int | str = 1  # gradient norms every k-th step (0 = never; "auto": ≤ 1% of the time)
    gns_decay: float = 0.95  # the noise-scale estimate's moving-average decay
    log_every: int = 50  # a progress line every this many steps (0 = none)
    run_dir: str | None = None  # the run's events and metrics (None: TAIJI_RUN_DIR; "": none)


@dataclass(frozen=True)
class FaultOptions:
    """How the Job survives failures."""

    recovery_timeout: float | None = None  # seconds to wait for a new cluster (None: TAIJI_RECOVERY_TIMEOUT)
    checkpoint: Checkpoint | None = None  # durable checkpoints (None: `taiji run --checkpoint-dir`, if given)


@dataclass(frozen=True)
class SyncOptions:
    """How the workers' models are kept in step, beyond ``strategy=``."""

    strategies: Mapping[str, Strategy] | None = None  # the ones SetStrategy may switch to, by name
    sync_every: int | None = None  # decoupled strategies meet every this many samples (None: an epoch)
    topology: str | None = None  # the allreduce plan (None: `taiji run --topology`, else ring)


# the keyword each group replaced -> (the group's Job keyword, its field)
_MOVED: dict[str, tuple[str, str]] = {
    "seed": ("data", "seed"),
    "shuffle": ("data", "shuffle"),
    "collate_fn": ("data", "collate_fn"),
    "device": ("data", "device"),
    "load_ahead": ("data", "load_ahead"),
    "monitor_every": ("monitoring", "every"),
    "gns_decay": ("monitoring", "gns_decay"),
    "log_every": ("monitoring", "log_every"),
    "run_dir": ("monitoring", "run_dir"),
    "recovery_timeout": ("faults", "recovery_timeout"),
    "checkpoint": ("faults", "checkpoint"),
    "strategies": ("sync", "strategies"),
    "sync_every": ("sync", "sync_every"),
    "topology": ("sync", "topology"),
}
_GROUPS = {"data": DataOptions, "monitoring": MonitorOptions, "faults": FaultOptions, "sync": SyncOptions}


def grouped(groups: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """``groups`` (Job keyword -> its options object) with the old keywords in ``old`` moved into
    them, each with a DeprecationWarning naming its new place; an unknown keyword is a TypeError."""
    unknown = sorted(set(old) - set(_MOVED))
    if unknown:
        raise TypeError(f"Job() got unexpected keyword argument(s) {', '.join(unknown)}")
    result = dict(groups)
    for name, value in old.items():
        group, field = _MOVED[name]
        option_class = _GROUPS[group]
        warnings.warn(
            f"taiji.Job({name}=...) is deprecated and will be removed in the next release: pass "
            f"taiji.Job(..., {group}=taiji.{option_class.__name__}({field}=...))",
            DeprecationWarning,
            stacklevel=3,
        )
        result[group] = replace(result[group], **{field: value})
    return result


@dataclass(frozen=True)
class TrainingOptions:
    batch_size: int  # the initial global batch
    epochs: int = 1
    max_steps: int | None = None  # stop after this many committed steps (whatever the epochs)
    monitor_every: int | str = (
        1  # measure the gradient norms every k-th step (0 = never; "auto": ≤ 1% of the time)
    )
    sync_every: int | None = None  # decoupled strategies meet every this many samples (None = an epoch)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.epochs < 1 and self.max_steps is None:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {self.max_steps}")
        if self.monitor_every != "auto" and not (
            isinstance(self.monitor_every, int) and self.monitor_every >= 0
        ):
            raise ConfigError(
                f'monitor_every must be an int >= 0 (0 = off) or "auto", got {self.monitor_every!r}'
            )
        if self.sync_every is not None and self.sync_every < 1:
            raise ConfigError(f"sync_every must be >= 1 samples, got {self.sync_every}")

    def done(self, step: int, epoch: int) -> bool:
        return (self.max_steps is not None and step >= self.max_steps) or epoch >= self.epochs

    def samples_to_train(self, num_samples: int, step: int, position: int, batch_size: int) -> int:
        """Global position (epoch·N + cursor) where training will end, for schedulers' estimates:
        the epochs' end, or sooner under ``max_steps`` at the current batch size."""
        end = self.epochs * num_samples
        if self.max_steps is not None:
            end = min(end, position + max(self.max_steps - step, 0) * batch_size)
        return end
