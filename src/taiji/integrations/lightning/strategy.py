"""TaijiStrategy: a Lightning Trainer's fit loop on taiji's elastic SyncSGD.

``L.Trainer(strategy=TaijiStrategy(policies=[...]), max_steps=...)`` under ``taiji run`` (or plain
``python``: one worker). The Trainer keeps its loop, hooks, validation, logging and ModelCheckpoint;
each of its training batches is one step of a ``taiji.Job`` over the Trainer's training data set
(``integrations.loop``):

- **data**: the train DataLoader's data set, ``batch_size`` (the *global* batch: N workers follow the
  1-worker trajectory), ``collate_fn`` and shuffling are read once; the Trainer then reads a loader of
  tickets and ``training_step`` gets this worker's share of the Job's step — exactly once per epoch
  across resizes, batch-size changes and failures;
- **the step**: ``backward`` sends the gradients as it runs (SyncSGD's buckets); ``optimizer_step``
  commits only if every collective succeeded, else the survivors re-form and the same step runs
  again (``training_step`` and backward over the new share) before the Trainer moves on;
- **the boundary**: policies (batch size, LR, resize, stop), in-place grow and shrink, taiji's
  checkpoints (``faults=taiji.FaultOptions(checkpoint=...)``) happen there; the monitors (loss over the
  global batch, GNS, batch size, workers, samples/s) go to the Trainer's loggers every
  ``log_every_n_steps``;
- **Lightning's checkpoints** (``ModelCheckpoint``, ``trainer.save_checkpoint``) carry the Job's
  TrainState under the key ``"taiji"`` (``save_checkpoint``); ``trainer.fit(..., ckpt_path=...)``
  loads it into the Job before its first step (``load_checkpoint``), so training continues where the
  checkpoint's data stood: every sample of the epoch after its step exactly once.

What the Trainer does outside the step is its own: validation runs on every worker over the whole
validation set (``self.log(..., sync_dist=True)`` averages over the current workers on taiji's user
channel); a joiner counts ``trainer.global_step`` and ``current_epoch`` from where it joined (the
agreed step is ``strategy.progress.step``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader, RandomSampler, default_collate

import taiji

from ...errors import ConfigError
from ...policies.base import Policy
from ...strategies.base import Strategy
from ..loop import FrameworkLoop, Tickets, check_one_resume, saved_state, step_metrics
from .environment import TaijiEnvironment

log = logging.getLogger(__name__)

_OPS = {"mean": "avg", "avg": "avg", "sum": "sum", "max": "max", "min": "min"}


class TaijiStrategy(ParallelStrategy):
    strategy_name = "taiji"

    def __init__(
        self,
        *,
        policies: Sequence[Policy] = (),
        strategy: Strategy | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        monitoring: taiji.MonitorOptions | None = None,
        faults: taiji.FaultOptions | None = None,
        sync: taiji.SyncOptions | None = None,
        on_commit: Callable[[Any], None] | None = None,
        **lightning: Any,
    ):
        super().__init__(cluster_environment=TaijiEnvironment(), **lightning)
        self._policies, self._taiji_strategy = list(policies), strategy
        self._batch_size, self._seed = batch_size, seed
        self._monitoring = monitoring or taiji.MonitorOptions(log_every=0)
        self._faults, self._sync = faults or taiji.FaultOptions(), sync or taiji.SyncOptions()
        self._on_commit = on_commit  # called with each committed taiji.Step (as ``taiji.Job(on_commit=)``)
        self._lr_scheduler: Any = None
        self._loaded: tuple[str, Any] | None = None  # (path, its "taiji" entry) of the last checkpoint loaded
        self.loop: FrameworkLoop | None = None

    # -- where and who ---------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return False  # no DistributedSampler: the training data is the Job's, validation is whole

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def setup_environment(self) -> None:
        taiji.init()
        self._ranks_changed()
        super().setup_environment()

    def setup(self, trainer: Any) -> None:
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(
                "TaijiStrategy: accumulate_grad_batches must be 1; the global batch is the "
                "DataLoader's batch_size (or TaijiStrategy(batch_size=...)) whatever the workers"
            )
        super().setup(trainer)
        if trainer.training:
            self._take_lr_scheduler()

    def _take_lr_scheduler(self) -> None:
        """A per-step scheduler is stepped at each commit and synced to joiners with the Job's state."""
        if len(self.optimizers) != 1:
            raise ConfigError("TaijiStrategy trains with exactly one optimizer")
        configs = self.lr_scheduler_configs
        if len(configs) > 1 or any(c.interval != "step" or c.frequency != 1 for c in configs):
            raise ConfigError(
                "TaijiStrategy: at most one LR scheduler, with interval='step' and frequency=1 "
                "(it is stepped at each committed step and synced to joining workers)"
            )
        self._lr_scheduler = configs[0].scheduler if configs else None
        self.lr_scheduler_configs = []

    @property
    def progress(self) -> Any:
        """Where training stands, agreed by every worker (``taiji.Job.progress``)."""
        assert self.loop is not None, "the Trainer has not started fitting"
        return self.loop.job.progress

    # -- data --------------------------------------------------------------------------------

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer
        if not trainer.training:
            return dataloader
        if self.loop is None:
            self.loop = self._make_loop(dataloader, trainer)
        return Tickets(self.loop)

    def _make_loop(self, dataloader: object, trainer: Any) -> FrameworkLoop:
        if not isinstance(dataloader, DataLoader) or dataloader.batch_size is None:
            raise ConfigError(
                "TaijiStrategy needs a train DataLoader with a batch_size over a map-style data set"
            )
        batch_size = self._batch_size or dataloader.batch_size
        dataset = dataloader.dataset
        collate = None if dataloader.collate_fn is default_collate else dataloader.collate_fn
        device = None if self.root_device.type == "cpu" else self.root_device
        data = taiji.DataOptions(
            seed=self._seed,
            shuffle=isinstance(dataloader.sampler, RandomSampler),
            collate_fn=collate,
            device=device,
        )
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 10**9
        resume = self._resume_state(trainer.ckpt_path) if trainer.ckpt_path else None

        def make_job() -> Any:
            return taiji.Job(
                self.lightning_module,
                self.optimizers[0],
                dataset,
                batch_size,
                epochs=epochs,
                max_steps=max_steps,
                strategy=self._taiji_strategy,
                policies=self._policies,
                lr_scheduler=self._lr_scheduler,
                data=data,
                monitoring=self._monitoring,
                faults=self._faults,
                sync=self._sync,
                on_commit=self._on_commit,
            )

        return FrameworkLoop(make_job, len(dataset), max_steps, resume=resume)  # type: ignore[arg-type]

    # -- Lightning's checkpoints carry taiji's state ----------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Lightning's checkpoint, with the Job's TrainState under ``"taiji"`` (where the data stands)."""
        state = (
            saved_state(self.loop.job, taiji.size()) if self.loop is not None and self.loop.started else None
        )
        if state is not None:
            checkpoint["taiji"] = state
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._loaded = (str(checkpoint_path), checkpoint.get("taiji"))
        return checkpoint

    def _resume_state(self, ckpt_path: Any) -> Any:
        """The taiji state of the checkpoint ``fit`` resumes from (Lightning loaded it already)."""
        check_one_resume(self._faults, f"ckpt_path={str(ckpt_path)!r}")
        if self._loaded is None or self._loaded[0] != str(ckpt_path):
            raise ConfigError(f"TaijiStrategy: Lightning did not load {ckpt_path} through the strategy")
        if self._loaded[1] is None:
            raise ConfigError(
                f"{ckpt_path} was not written under TaijiStrategy: it does not say where the data "
                "stands (taiji's sampler, batch size, policies). Start a new fit from its weights "
                "(LightningModule.load_from_checkpoint) without ckpt_path"
            )
        return self._loaded[1]

    def on_train_start(self) -> None:
        super().on_train_start()
        assert self.loop is not None
        self.loop.start()  # a joiner waits here to be admitted; every worker syncs
        self._ranks_changed()

    # -- the step -----------------------------------------------------------------------------

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        loop = self.loop
        if loop is None or loop.step is None:
            return None  # training ended at the last boundary (a policy's Stop): nothing to train
        return super().training_step(loop.batch, *args[1:], **kwargs)

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert self.loop is not None and self.loop.step is not None
        module = self.lightning_module
        self.pre_backward(closure_loss)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        self.loop.step.backward(closure_loss)  # gradients averaged over the global batch as backward runs
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        """Run the closure (training_step and backward) until the step commits; the update is
        applied at the commit, by the Job."""
        loop = self.loop
        assert loop is not None
        while True:
            result = closure()
            if loop.step is None:
                break
            if not loop.step.failed:
                self._before_update(optimizer)
            if loop.finish():
                break
            log.info("step %d is run again over the %d surviving workers", loop.step.index, taiji.size())
        self._committed()
        return result

    def _before_update(self, optimizer: Any) -> None:
        module, trainer = self.lightning_module, self.lightning_module.trainer
        module.on_before_optimizer_step(optimizer)
        if trainer.gradient_clip_val:
            module.configure_gradient_clipping(
                optimizer,
                gradient_clip_val=trainer.gradient_clip_val,
                gradient_clip_algorithm=trainer.gradient_clip_algorithm,
            )

    def _committed(self) -> None:
        loop = self.loop
        assert loop is not None
        trainer = self.lightning_module.trainer
        self._ranks_changed()
        if loop.ended:
            trainer.should_stop = True
        every = max(1, trainer.log_every_n_steps)
        step = loop.job.progress.step
        if step % every == 0 or loop.ended:
            metrics = step_metrics(loop.job, taiji.size())
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def _ranks_changed(self) -> None:
        rank_zero_only.rank = fabric_rank_zero_only.rank = taiji.rank()

    # -- the Trainer's own collectives (validation, callbacks) ---------------------------------

    def _together(self) -> bool:
        """Collectives go to the current workers while the Job runs; before it (a sanity check on a
        joiner not yet admitted) and after it, each worker answers alone."""
        return self.loop is not None and self.loop.started and not self.loop.ended and taiji.size() > 1

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or not self._together():
            return tensor
        name = str(getattr(reduce_op, "name", reduce_op) or "mean").lower().replace("reduceop.", "")
        op = _OPS.get(name)
        if op is None:
            raise ConfigError(f"TaijiStrategy.reduce: unsupported reduce_op {reduce_op!r}")
        result = tensor.detach().clone()
        if op == "avg" and not result.is_floating_point():
            result = result.double()
        taiji.allreduce(result, op)
        return result

    def barrier(self, name: str | None = None) -> None:
        if self._together():
            taiji.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Tensors as they are; other objects as JSON (nothing received is unpickled)."""
        if not self._together():
            return obj
        if isinstance(obj, torch.Tensor):
            result = obj.detach().clone()
            taiji.broadcast(result, src=src)
            return result
        data = json.dumps(str(obj) if isinstance(obj, Path) else obj).encode()
        length = torch.tensor([len(data)], dtype=torch.int64)
        taiji.broadcast(length, src=src)
        payload = torch.zeros(int(length.item()), dtype=torch.uint8)
        if taiji.rank() == src:
            payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        taiji.broadcast(payload, src=src)
        value = json.loads(bytes(payload.tolist()).decode())
        return Path(value) if isinstance(obj, Path) else value

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        if not self._together():
            return tensor.unsqueeze(0)
        return torch.stack(list(taiji.allgather(tensor.detach().clone())))

    def teardown(self) -> None:
        if self.loop is not None and self.loop.started and not self.loop.ended:
            self.loop.job.close()
        super().teardown()
