"""TrainState: everything replicas agree on, and the protocol that makes them agree.

TrainState holds the model, the optimizer, where training stands (``Progress``), the strategy's
name and the state of the parts registered with it (LR scheduler, monitors, policies, an open
decoupled phase). ``state_dict()``/``load_state_dict()`` carry all but the model's tensors, which
travel in place.

**Sync** (after every membership change): workers allgather their ``step`` (-1 for a worker
with no state: a joiner); the source is the lowest rank with the highest step. If anyone differs
(or ``force``), the source broadcasts its ``state_dict`` as JSON with tensor placeholders, then
the model's and the state's tensors coalesced per (device, dtype). Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import torch

from .. import env
from ..comm.communicator import Communicator
from ..comm.transfer import broadcast_bytes, broadcast_tensors, decode, encode, module_tensors, tensor_specs
from ..data.sampler import SamplerState, advance
from ..errors import CommError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """Where training stands; identical on every replica after each committed step."""

    step: int = 0
    sampler: SamplerState = SamplerState()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def to_json(self) -> dict:
        return {"step": self.step, **asdict(self.sampler)}

    @staticmethod
    def from_json(data: dict) -> Progress:
        return Progress(
            step=int(data["step"]),
            sampler=SamplerState(
                epoch=int(data["epoch"]), cursor=int(data["cursor"]), batch_size=int(data["batch_size"])
            ),
        )


class Stateful(Protocol):
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


def choose_source(steps: list[int]) -> int:
    """The lowest rank among those with the highest step (-1 = no state)."""
    best = max(steps)
    if best < 0:
        raise CommError("no worker of the new cluster holds training state; cannot continue")
    return steps.index(best)


class TrainState:
    """The replicated training state (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        num_samples: int,
        batch_size: int,
        strategy: str,
        parts: Mapping[str, Stateful],
        has_state: bool = True,
    ):
        self.model = model
        self.optimizer = optimizer
        self.num_samples = num_samples
        self.progress = Progress(sampler=SamplerState(batch_size=batch_size))
        self.strategy = strategy
        self.topology = env.TOPOLOGY.get()  # how gradients are allreduced (SetTopology; comm/topology.py)
        self.parts = dict(parts)
        self.has_state = has_state  # False on a joiner until its first sync
        self._guards: list[Callable[[], None]] = []

    def guard(self, before_overwrite: Callable[[], None]) -> None:
        """Call ``before_overwrite`` before a sync overwrites the tensors in place (a checkpoint
        may still be staging them)."""
        self._guards.append(before_overwrite)

    def _overwriting(self) -> None:
        for before_overwrite in self._guards:
            before_overwrite()

    def register(self, name: str, part: Stateful) -> None:
        """Add a part whose state replicas must agree on (synced with the rest)."""
        self.parts[name] = part

    # -- where training stands ------------------------------------------------------------

    def advance(self, global_batch: int) -> bool:
        """A step over ``global_batch`` samples was committed; True if it ended an epoch."""
        epoch = self.progress.epoch
        self.progress = Progress(
            self.progress.step + 1, advance(self.progress.sampler, global_batch, self.num_samples)
        )
        return self.progress.epoch != epoch

    def advance_to(self, position: int, steps: int) -> bool:
        """A decoupled phase ended at global ``position`` (epoch·N + cursor) after ``steps``
        global-batch equivalents; True if the epoch changed."""
        epoch = self.progress.epoch
        new_epoch, cursor = divmod(position, self.num_samples)
        self.progress = Progress(
            self.progress.step + steps, replace(self.progress.sampler, epoch=new_epoch, cursor=cursor)
        )
        return self.progress.epoch != epoch

    def count_step(self) -> None:
        """A step outside a Job (no sampler): only the counter moves."""
        self.progress = replace(self.progress, step=self.progress.step + 1)

    def set_batch_size(self, batch_size: int) -> None:
        """From the next step on; the cursor stays, so the epoch stays exactly-once."""
        self.progress = replace(self.progress, sampler=replace(self.progress.sampler, batch_size=batch_size))

    @property
    def position(self) -> int:
        return self.progress.epoch * self.num_samples + self.progress.sampler.cursor

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model's tensors (they are synced in place)."""
        return {
            "progress": self.progress.to_json(),
            "strategy": self.strategy,
            "topology": self.topology,
            "optimizer": self.optimizer.state_dict(),
            "parts": {name: part.state_dict() for name, part in self.parts.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._overwriting()
        self.progress = Progress.from_json(state["progress"])
        self.strategy = state["strategy"]
        self.topology = state.get("topology", self.topology)
        self.optimizer.load_state_dict(state["optimizer"])
        for name, part_state in state["parts"].items():
            if name in self.parts:
                self.parts[name].load_state_dict(part_state)
        self.has_state = True

    # -- the sync protocol ------------------------------------------------------------------

    def sync(self, comm: Communicator, force: bool = False) -> bool:
        """Make this replica hold the most advanced replica's state. True if it received it."""
        if comm.size == 1:
            self.has_state = True
            return False
        self._overwriting()
        rows = comm.allgather(torch.tensor([self.progress.step if self.has_state else -1], dtype=torch.int64))
        steps = [int(r.item()) for r in rows]  # type: ignore[union-attr]
        source = choose_source(steps)
        if not force and all(s == steps[source] for s in steps):
            return False
        payload = None
        tensors: list[torch.Tensor] = []
        if comm.rank == source:
            payload = json.dumps(encode(self.state_dict(), tensors)).encode()
        image = json.loads(broadcast_bytes(payload, comm, source))
        if comm.rank != source:
            tensors = [
                torch.empty(shape, dtype=dtype, device=device) for dtype, shape, device in tensor_specs(image)
            ]
        broadcast_tensors(module_tensors(self.model) + tensors, comm, source)
        if comm.rank == source:
            return False
        self.load_state_dict(decode(image, tensors))
        return True
