"""The Job's training options, checked once."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class TrainingOptions:
    batch_size: int                  # the initial global batch
    epochs: int = 1
    max_steps: int | None = None     # stop after this many committed steps (whatever the epochs)
    monitor_every: int | str = 1     # measure the gradient norms every k-th step (0 = never; "auto": ≤ 1% of the time)
    sync_every: int | None = None    # decoupled strategies meet every this many samples (None = an epoch)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.epochs < 1 and self.max_steps is None:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {self.max_steps}")
        if self.monitor_every != "auto" and not (isinstance(self.monitor_every, int) and self.monitor_every >= 0):
            raise ConfigError(f"monitor_every must be an int >= 0 (0 = off) or \"auto\", got {self.monitor_every!r}")
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
