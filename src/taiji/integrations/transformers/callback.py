"""TaijiCallback: what a Trainer callback can do for taiji — the agreed monitors in the Trainer's logs.

Each time the Trainer logs, the last committed step's loss over the global batch, gradient noise
scale, batch size, workers and samples/s are added (``taiji/...``), so they reach every reporting
integration the Trainer has (TensorBoard, ...). ``TaijiTrainer`` adds it itself.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

import taiji

from ..loop import FrameworkLoop, step_metrics


class TaijiCallback(TrainerCallback):
    def __init__(self, loop: FrameworkLoop):
        self.loop = loop

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is not None and self.loop.job is not None:
            logs.update(step_metrics(self.loop.job, taiji.size()))
