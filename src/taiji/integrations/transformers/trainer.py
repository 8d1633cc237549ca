"""TaijiTrainer: a Hugging Face Trainer whose steps are a ``taiji.Job``'s (``integrations.loop``).

The Trainer owns its sampler, batch size and optimizer step; taiji needs all three. So:

- **data**: ``get_train_dataloader`` returns a loader of tickets; ``training_step`` trains on this
  worker's share of the Job's step over ``train_dataset`` (collated by ``data_collator``, global batch
  ``per_device_train_batch_size`` — the *global* batch whatever the workers; shuffled with
  ``data_seed`` or ``seed``), exactly once per epoch across resizes, batch-size changes (a policy's
  ``SetBatchSize``: the Trainer's own batch size is not used) and failures;
- **the step**: ``training_step`` runs forward and backward (gradients averaged over the global batch
  as backward runs), clips to ``max_grad_norm`` and commits — or, if a peer failed, runs the same
  step again over the survivors before it returns. The update, and the LR scheduler's step, are
  applied at the commit (the scheduler's state is synced to joining workers); the Trainer's own
  ``optimizer.step()`` and ``lr_scheduler.step()`` that follow do nothing (``AppliedAtCommit``,
  ``SteppedAtCommit``), and its ``grad_norm`` log is the norm taken before the commit (the
  gradients are cleared by the time the Trainer would take it);
- **the boundary**: policies, grow and shrink, taiji's checkpoints; ``TaijiCallback`` adds the
  monitors to the Trainer's logs. Only the current rank 0 logs and saves;
- **the Trainer's checkpoints**: each ``checkpoint-N`` folder gets the Job's TrainState as
  ``taiji_state.pt`` (written before the Trainer's own files); ``train(resume_from_checkpoint=...)``
  loads it into the Job before its first step, so the data continues where the checkpoint's step
  left it (the Trainer's own batch skipping, meaningless for a loader of tickets, is off:
  ``ignore_data_skip``).

The Trainer must see one process (Accelerate would otherwise open a torch.distributed group of the
launch-time size): build the arguments as ``TaijiTrainingArguments``, which hides torchrun's
variables from Accelerate. Needs ``max_steps > 0`` (an epoch's number of steps changes with the
batch size), ``gradient_accumulation_steps == 1`` (the global batch replaces accumulation).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

import taiji

from ...errors import ConfigError
from ...policies.base import Policy
from ...strategies.base import Strategy
from ..loop import FrameworkLoop, Tickets, check_one_resume, saved_state
from .callback import TaijiCallback

log = logging.getLogger(__name__)

STATE_FILE = "taiji_state.pt"  # in each checkpoint-N folder: the Job's TrainState
_TORCHRUN = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
)


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """torchrun's variables (``taiji run`` sets them for torchrun-style scripts) hidden meanwhile."""
    saved = {name: os.environ.pop(name) for name in _TORCHRUN if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class TaijiTrainingArguments(TrainingArguments):
    """TrainingArguments for one process per taiji worker; only the current rank 0 saves."""

    def __post_init__(self) -> None:
        with _one_process():
            super().__post_init__()

    @property
    def should_save(self) -> bool:
        return taiji.rank() == 0

    @property
    def should_log(self) -> bool:
        return taiji.rank() == 0


class AppliedAtCommit(torch.optim.Optimizer):
    """The optimizer the Trainer steps: the update was applied when the step committed. Its parameter
    groups (where the scheduler writes learning rates), state and defaults are the real optimizer's,
    read through, so they stay the same objects even after the real one loads a state dict."""

    def __init__(self, optimizer: torch.optim.Optimizer):  # no Optimizer.__init__: nothing of its own
        self.optimizer = optimizer
        self._optimizer_step_pre_hooks: dict = collections.OrderedDict()
        self._optimizer_step_post_hooks: dict = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks: dict = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks: dict = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: dict = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks: dict = collections.OrderedDict()

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.optimizer.state

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Nothing: the Job applied the update at the commit."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)


class SteppedAtCommit:
    """The LR scheduler the Trainer steps: the Job stepped the real one at the commit."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the Job stepped the scheduler at the commit."""

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    @property
    def base_lrs(self) -> list[float]:
        return self.scheduler.base_lrs

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)


class TaijiTrainer(Trainer):
    def __init__(
        self,
        *args: Any,
        policies: Sequence[Policy] = (),
        strategy: Strategy | None = None,
        shuffle: bool = True,
        monitoring: taiji.MonitorOptions | None = None,
        faults: taiji.FaultOptions | None = None,
        sync: taiji.SyncOptions | None = None,
        on_commit: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ):
        with _one_process():
            super().__init__(*args, **kwargs)
        if self.args.world_size != 1:
            raise ConfigError(
                "TaijiTrainer needs one process per worker as the Trainer sees it: build the "
                "arguments as taiji.integrations.transformers.TaijiTrainingArguments"
            )
        if self.args.gradient_accumulation_steps != 1 or self.args.max_steps <= 0:
            raise ConfigError(
                "TaijiTrainer needs max_steps > 0 and gradient_accumulation_steps == 1 (the global "
                "batch is per_device_train_batch_size, whatever the number of workers)"
            )
        if self.train_dataset is None:
            raise ConfigError("TaijiTrainer needs a train_dataset (a map-style data set)")
        taiji.init()
        self._taiji = dict(
            policies=list(policies),
            strategy=strategy,
            on_commit=on_commit,
            monitoring=monitoring or taiji.MonitorOptions(log_every=0),
            faults=faults or taiji.FaultOptions(),
            sync=sync or taiji.SyncOptions(),
        )
        self._shuffle = shuffle
        self._max_grad_norm = self.args.max_grad_norm
        self.args.max_grad_norm = 0.0  # clipped before the commit, not after it
        self.args.ignore_data_skip = True  # a resumed Job's sampler starts where the checkpoint's stood
        self._grad_norm: Any = None  # of the last committed step, before clipping
        self._real_optimizer: torch.optim.Optimizer | None = None
        self._real_scheduler: Any = None
        self.loop = FrameworkLoop(self._make_job, len(self.train_dataset), self.args.max_steps)  # type: ignore[arg-type]
        # first, so that every reporting callback (printer, TensorBoard, ...) sees the monitors it adds
        self.callback_handler.callbacks.insert(0, TaijiCallback(self.loop))

    def _make_job(self) -> Any:
        if self._real_optimizer is None:
            raise ConfigError("TaijiTrainer: the optimizer was not created through create_optimizer")
        device = None if self.args.device.type == "cpu" else self.args.device
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        data = taiji.DataOptions(
            seed=seed, shuffle=self._shuffle, collate_fn=self.data_collator, device=device
        )
        return taiji.Job(
            self.model,
            self._real_optimizer,
            self.train_dataset,
            self.args.per_device_train_batch_size,
            epochs=10**9,
            max_steps=self.args.max_steps,
            lr_scheduler=self._real_scheduler,
            data=data,
            **self._taiji,
        )

    # -- the Trainer's checkpoints carry taiji's state ---------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's ``train``; from a checkpoint, the Job resumes from the taiji state saved in it."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint:
            check_one_resume(self._taiji["faults"], f"resume_from_checkpoint={resume_from_checkpoint!r}")
            path = Path(resume_from_checkpoint) / STATE_FILE
            if not path.is_file():
                raise ConfigError(
                    f"{resume_from_checkpoint} holds no {STATE_FILE}: it was not written by "
                    "TaijiTrainer, so it does not say where the data stands (taiji's sampler, batch "
                    "size, policies). Start a new training from its weights instead"
                )
            self.loop.resume = torch.load(path, weights_only=True)
        return super().train(resume_from_checkpoint or None, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's checkpoint-N, with ``taiji_state.pt`` written first (atomically): a folder
        with the Trainer's files complete also holds where the data stands."""
        state = saved_state(self.loop.job, taiji.size()) if self.args.should_save else None
        if state is not None:
            folder = (
                Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{STATE_FILE}.partial"
            torch.save(state, partial)
            partial.replace(folder / STATE_FILE)
        super()._save_checkpoint(model, trial)

    def _save_rng_state(self, output_dir: str) -> None:
        """Rank 0's (the Trainer sees one process: every worker would write the same file)."""
        if self.args.should_save:
            super()._save_rng_state(output_dir)

    # -- what the Trainer builds ------------------------------------------------------------------

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        if self._real_optimizer is None:
            self._real_optimizer = super().create_optimizer(model)
            self.optimizer = AppliedAtCommit(self._real_optimizer)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        if self._real_scheduler is None:
            self._real_scheduler = super().create_scheduler(num_training_steps, optimizer)
            self.lr_scheduler = SteppedAtCommit(self._real_scheduler)
        return self.lr_scheduler

    def get_train_dataloader(self) -> Any:
        return Tickets(self.loop)

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        """The norm taken before the commit (one pass, as the Trainer's own with clipping)."""
        return self._grad_norm

    def is_world_process_zero(self) -> bool:
        return taiji.rank() == 0

    # -- the step -----------------------------------------------------------------------------

    def training_step(
        self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """Forward and backward on this worker's share of the Job's step, until it commits."""
        loop = self.loop
        loss = torch.zeros((), device=self.args.device)
        while loop.step is not None:
            model.train()
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, loop.batch)
            loop.step.backward(loss)
            if not loop.step.failed:  # the norm the Trainer logs; clipped to max_grad_norm if set
                limit = (
                    self._max_grad_norm if self._max_grad_norm and self._max_grad_norm > 0 else float("inf")
                )
                self._grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
            if loop.finish():
                break
            log.info("step %d is run again over the %d surviving workers", loop.step.index, taiji.size())
        self.state.is_world_process_zero = self.is_world_process_zero()
        if loop.ended:
            self.control.should_training_stop = True
        return loss.detach()
