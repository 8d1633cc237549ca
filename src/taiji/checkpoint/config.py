"""What to checkpoint, where and when: ``Checkpoint``, and the pure rule deciding a step is due.

The rule reads only values every worker agrees on (the committed step and rank 0's clock as
carried by the step's control message), so every worker reaches the same answer at the same
step boundary without a message of its own.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace

from .. import env
from ..errors import ConfigError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
# A preemption notice under `taiji run`: the launcher passes SIGTERM on to its workers as this
# signal (a worker's own SIGTERM stays a failure its peers recover from); a plain process takes SIGTERM.
NOTICE_SIGNAL = signal.SIGUSR1


def parse_every(text: str | int | float) -> tuple[float | None, int | None]:
    """``"10m"``/``"90s"``/``"2h"`` -> (seconds, None); ``"500"`` or 500 -> (None, steps)."""
    if isinstance(text, bool):
        raise ConfigError(f"a checkpoint interval must be a duration or a step count, got {text!r}")
    if isinstance(text, int):
        return None, text
    if isinstance(text, float):
        return text, None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None:
        raise ConfigError(
            f"cannot read the checkpoint interval {text!r}: give a duration (90s, 10m, 2h) "
            "or a number of steps (500)"
        )
    value, unit = match.groups()
    if not unit:
        if "." in value:
            raise ConfigError(f"a checkpoint interval in steps must be a whole number, got {text!r}")
        return None, int(value)
    return float(value) * _UNITS[unit], None


@dataclass(frozen=True)
class Checkpoint:
    """Checkpoint the Job's whole state into ``path`` (a directory or an fsspec URL).

    ``every``: a duration ("10m") or a step count; ``steps``: a step count (one of the two, or
    neither: only a final checkpoint when training stops). ``keep``: complete checkpoints kept.
    ``resume``: None (start fresh), ``"auto"`` (the latest complete checkpoint in ``path``, if
    any) or a checkpoint's path. ``final``: also checkpoint when training stops (a stop request,
    a preemption notice, the end of training). ``overlap``: stage the parameters and optimizer
    state while the next step's forward and backward run (its optimizer update waits for them);
    False stages everything at the step boundary: for code that changes parameters or optimizer
    state in place other than through the optimizer (or a taiji sync) between steps.
    """

    path: str = ""
    every: str | int | float | None = None
    steps: int | None = None
    keep: int = 3
    resume: str | None = None
    final: bool = True
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.every is not None and self.steps is not None:
            raise ConfigError("give a checkpoint interval as every= or steps=, not both")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"Checkpoint(steps=...) must be >= 1, got {self.steps}")
        if self.keep < 1:
            raise ConfigError(f"Checkpoint(keep=...) must be >= 1, got {self.keep}")
        seconds, steps = self.interval
        if (seconds is not None and seconds <= 0) or (steps is not None and steps < 1):
            raise ConfigError(f"the checkpoint interval must be positive, got {self.every!r}")
        if not self.path and self.resume in (None, "auto"):
            raise ConfigError(
                "Checkpoint needs a path (a directory or an fsspec URL such as s3://bucket/run)"
            )

    @property
    def interval(self) -> tuple[float | None, int | None]:
        """(seconds, steps): at most one is set."""
        if self.steps is not None:
            return None, self.steps
        return parse_every(self.every) if self.every is not None else (None, None)

    @property
    def saves(self) -> bool:
        """Whether this checkpoint writes anything (it has a path; a resume-only one has none)."""
        return bool(self.path)

    @staticmethod
    def from_env() -> Checkpoint | None:
        """The launcher's setting (`taiji run --checkpoint-dir/--checkpoint-every/--resume`)."""
        path, every, resume = env.CHECKPOINT_DIR.get(), env.CHECKPOINT_EVERY.get(), env.RESUME.get()
        if not path and not resume:
            return None
        return Checkpoint(path, every=every or None, resume=resume or None)

    @staticmethod
    def resolve(given: Checkpoint | None) -> Checkpoint | None:
        """The setting a worker trains with: ``given`` (the script's own) over the launcher's
        (``from_env``), as ``effective`` merges them."""
        return effective(given, Checkpoint.from_env())


def effective(given: Checkpoint | None, launcher: Checkpoint | None) -> Checkpoint | None:
    """The script's own ``Checkpoint`` wins; the launcher's (``taiji run --checkpoint-dir``) is the
    default, and its ``--resume`` applies to a script's Checkpoint that does not say how to resume."""
    if given is None:
        return launcher
    if given.resume is None and launcher is not None and launcher.resume is not None:
        return replace(given, resume=launcher.resume)
    return given


def due(
    step: int, clock: float, last_step: int, last_clock: float, interval: tuple[float | None, int | None]
) -> bool:
    """Is a checkpoint due after committed ``step``, at agreed ``clock``, the last one having been
    taken at ``last_step``/``last_clock``? Pure: every worker evaluates it on agreed values."""
    seconds, steps = interval
    if step <= last_step:
        return False
    if steps is not None:
        return step % steps == 0
    if seconds is not None:
        return clock - last_clock >= seconds
    return False
