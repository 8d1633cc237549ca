"""Elastic training used by the invariant tests; logs every committed step as JSONL.

    taiji run -np N ... -- python elastic_train.py OUT --steps S --batch B
        [--sizes N ...] [--step-delay SECONDS] [--policy cycle|topology] [--device cuda]

Each worker appends to OUT/<worker>.jsonl one line per committed step: step, epoch, global
span, version, size, rank and a digest of the parameters and optimizer state after the
commit. The worker that ends as rank 0 writes OUT/final.pt (parameters).

``--policy cycle`` adds a policy that changes the global batch size every few steps from its
own counter (so a joiner that did not receive the policy state would decide differently and
the decision check would stop the job) and linear LR scaling.
"""

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import taiji
from taiji.comm.transfer import digest


def make_model():
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).double()
    g = torch.Generator().manual_seed(42)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return model


class CyclingBatch(taiji.policies.Policy):
    """Changes the global batch mid-epoch from a counter kept in (synced) policy state."""

    def __init__(self, base):
        self._base = base
        self.calls = 0

    def after_step(self, ctx):
        self.calls += 1
        if self.calls % 4 == 0:
            return taiji.policies.SetBatchSize(self._base + 3 * ((self.calls // 4) % 3) - 2)


class RaiseOnRank(taiji.policies.Policy):
    """A buggy policy: raises on one rank only (so the others would wait for it forever)."""

    def after_step(self, ctx):
        if ctx.step == 7 and taiji.rank() == 1:
            raise RuntimeError("bad policy")


class CyclingTopology(taiji.policies.Policy):
    """Switches the gradients' allreduce plan every few steps, from a counter kept in (synced)
    policy state (a joiner must adopt the plan the others use)."""

    def __init__(self):
        self.calls = 0

    def after_step(self, ctx):
        self.calls += 1
        if self.calls % 5 == 0:
            return taiji.policies.SetTopology(("tree", "hierarchical", "star", "ring")[(self.calls // 5) % 4])


class GrowThenShrink(taiji.policies.Policy):
    """Stops training a few steps after the cluster grew to ``peak`` workers and came back below it
    (a worker killed or removed): the test's schedule, agreed by every worker (synced state)."""

    def __init__(self, peak, after=5):
        self._peak, self._after = peak, after
        self.grown = False
        self.shrunk_at = -1

    def after_step(self, ctx):
        self.grown = self.grown or ctx.size >= self._peak
        if self.grown and ctx.size < self._peak and self.shrunk_at < 0:
            self.shrunk_at = ctx.step
        if self.shrunk_at >= 0 and ctx.step >= self.shrunk_at + self._after:
            return taiji.policies.Stop("the test's grow and shrink happened")


def open_worker_log(out):
    """This worker's log of committed steps (OUT/<worker>.jsonl), its pid in OUT/<worker>.pid (a
    test kills it by that pid), and taiji's INFO log lines on stderr."""
    taiji.log.configure_logging("INFO")
    worker = os.environ.get("TAIJI_WORKER_ID", "w0")
    (out / f"{worker}.pid").write_text(str(os.getpid()))
    return open(out / f"{worker}.jsonl", "a")


def log_commit(log_file, step, tensors):
    """One line of a worker's log: a committed step (as ``audit`` reads it) and a digest of ``tensors``."""
    log_file.write(
        json.dumps(
            {
                "step": step.index,
                "epoch": step.epoch,
                "span": list(step.span),
                "version": taiji.version(),
                "size": taiji.size(),
                "rank": taiji.rank(),
                "digest": digest(tensors),
                "time": time.time(),
            }
        )
        + "\n"
    )
    log_file.flush()


def make_policies(name, batch):
    if name == "raise":
        return [RaiseOnRank()]
    if name == "topology":
        return [CyclingTopology()]
    if name == "cycle":
        from taiji.policies import LinearLRScaling

        return [CyclingBatch(batch), LinearLRScaling()]
    return []


def make_data(n=203):
    g = torch.Generator().manual_seed(5)
    return TensorDataset(
        torch.randn(n, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g)
    )


def audit(out: Path, batch: int, policy: str = "", num_samples: int | None = None) -> dict:
    """Check invariants 1-3 (docs/design.md#invariants) from a run's logs; counts every violation.

    Returns steps, sizes (cluster size over time), divergences (steps after which replicas
    differ), lost / duplicated samples (within each epoch), and the largest difference from an
    uninterrupted 1-worker run (``trajectory_error``; None if no final parameters were saved).
    """
    import torch

    from taiji.runtime.peer import Peer

    by_step: dict[int, list[dict]] = defaultdict(list)
    worker_gaps: dict[str, list[int]] = {}
    last: dict[str, int] = {}
    for path in Path(out).glob("w*.jsonl"):
        mine = []
        for line in path.read_text().splitlines():
            record = dict(json.loads(line), worker=path.stem)
            by_step[record["step"]].append(record)
            mine += [] if record.get("decoupled") else [record["step"]]
        # a commit is one fact: every worker commits every step from its first to its last
        missing = sorted(set(range(min(mine), max(mine) + 1)) - set(mine)) if mine else []
        if missing:
            worker_gaps[path.stem] = missing
        last[path.stem] = max(mine, default=-1)
    steps = sorted(by_step)
    result = {
        "steps": len(steps),
        "sizes": [],
        "divergences": [],
        "gaps": [],
        "lost_samples": 0,
        "duplicated_samples": 0,
        "trajectory_error": None,
        "worker_gaps": worker_gaps,
        "orphans": [],
    }
    result["gaps"] = sorted(set(range(len(steps))) - set(steps)) + [s for s in steps if s >= len(steps)]
    seen: dict[int, list[int]] = defaultdict(list)
    for s in steps:
        group = by_step[s]
        # A worker dropped while it still ran (its host declared lost) may finish the step its
        # peers abandon for the new version, and commit it as its last act: the survivors redo the
        # step without it and its process leaves, so that commit counts for nothing. It is an
        # orphan, not a divergence, only if it is that worker's last step and the worker is not
        # among those who committed the step at the newer version.
        newest = max(r.get("version", 0) for r in group)
        now = {r["worker"] for r in group if r.get("version", 0) == newest}
        orphans = [
            r
            for r in group
            if r.get("version", 0) < newest and r["worker"] not in now and last[r["worker"]] == s
        ]
        result["orphans"] += [(r["worker"], s) for r in orphans]
        group = [r for r in group if r not in orphans]
        if (
            len({r["digest"] for r in group}) != 1
            or len({(r["epoch"], tuple(r["span"])) for r in group}) != 1
        ):
            result["divergences"].append(s)
        lo, hi = group[0]["span"]
        seen[group[0]["epoch"]].extend(range(lo, hi))
        if not result["sizes"] or result["sizes"][-1] != group[0]["size"]:
            result["sizes"].append(group[0]["size"])
    num_samples = len(make_data()) if num_samples is None else num_samples  # another script's data set
    last_epoch = max(seen, default=0)
    for epoch, positions in seen.items():
        result["duplicated_samples"] += len(positions) - len(set(positions))
        if epoch < last_epoch:
            result["lost_samples"] += num_samples - len(set(positions))
    final = Path(out) / "final.pt"
    if final.exists() and steps:
        # one intra-op thread, as a worker of a job that fills the host's cores: two OpenMP threads
        # spinning against the jobs beside it made a 638-step reference take 27 s instead of 0.6 s
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            reference, _ = train(Peer.solo(), len(steps), batch, policy=policy)
        finally:
            torch.set_num_threads(threads)
        result["trajectory_error"] = max(
            float((a - b).abs().max()) for a, b in zip(torch.load(final), reference)
        )
    return result


def make_strategy(name):
    from taiji.strategies.local_sgd import LocalSGD
    from taiji.strategies.model_averaging import ModelAveraging
    from taiji.strategies.pair_averaging import PairAveraging

    return {
        "": None,
        "sync_sgd": None,
        "model_averaging": ModelAveraging(alpha=0.5, every=2),
        "pair_averaging": PairAveraging(),
        "local_sgd": LocalSGD(every=4),
    }[name]


def audit_positions(out: Path) -> dict:
    """Exactly-once by global position (epoch·N + offset) for any strategy: lockstep steps are
    counted once per step, decoupled steps once per worker that ran them."""
    num = len(make_data())
    counts: dict[int, int] = defaultdict(int)
    lockstep: dict[int, list] = {}
    for path in Path(out).glob("w*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("decoupled"):
                for epoch, lo, hi in record["segments"]:
                    for i in range(lo, hi):
                        counts[epoch * num + i] += 1
            else:
                lockstep[record["step"]] = [(record["epoch"], *record["span"])]
    for segments in lockstep.values():
        for epoch, lo, hi in segments:
            for i in range(lo, hi):
                counts[epoch * num + i] += 1
    top = max(counts, default=-1) + 1
    return {
        "positions": top,
        "lost": sum(1 for p in range(top) if counts.get(p, 0) == 0),
        "duplicated": sum(c - 1 for c in counts.values() if c > 1),
    }


def train(
    peer,
    steps,
    batch,
    sizes=(),
    every=10,
    step_delay=0.0,
    log_path=None,
    stop_at_version=0,
    policy="",
    strategy="",
    slow_rank=-1,
    pause=None,
    device="cpu",
):
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    pending = list(sizes)
    next_at = every
    log_file = open(log_path, "a") if log_path else None

    def on_commit(step):
        if log_file is not None:
            state = [t for p in model.parameters() for t in (p, opt.state[p]["momentum_buffer"])]
            state = [p.detach() for p in model.parameters()] if strategy else state
            log_file.write(
                json.dumps(
                    {
                        "step": step.index,
                        "epoch": step.epoch,
                        "span": list(step.span),
                        "segments": [list(s) for s in step.segments],
                        "decoupled": not job.strategy.lockstep,
                        "version": peer.version,
                        "size": peer.size,
                        "rank": peer.rank,
                        "digest": digest(state),
                        "time": time.time(),
                        "lr": opt.param_groups[0]["lr"],
                    }
                )
                + "\n"
            )
            log_file.flush()

    job = taiji.Job(
        model,
        opt,
        make_data(),
        batch_size=batch,
        max_steps=steps,
        epochs=10**6,
        data=taiji.DataOptions(seed=11, device=device),
        monitoring=taiji.MonitorOptions(log_every=0),
        peer=peer,
        on_commit=on_commit,
        policies=make_policies(policy, batch),
        strategy=make_strategy(strategy),
        sync=taiji.SyncOptions(sync_every=5 * batch),
    )
    proposed = paused = False
    for step in job:
        if peer.rank == 0 and pending:
            if not proposed and step.index >= next_at:
                peer.propose_size(pending[0], "test schedule")
                proposed = True
            elif proposed and peer.size == pending[0]:  # landed: the next, `every` steps on
                pending.pop(0)
                proposed = False
                next_at = step.index + every
        elif peer.rank == 0 and sizes and step.index >= next_at:
            job.request_stop()  # the schedule is done: every worker stops at this boundary
        if stop_at_version and peer.version >= stop_at_version:
            job.request_stop()
        if pause and peer.rank == pause[0] and step.index == int(pause[1]) and not paused:
            paused = True  # an evaluation on one rank, in user code, while its peers wait
            time.sleep(pause[2])
        x, y = step.batch
        loss = F.cross_entropy(model(x), y)
        if step_delay:
            time.sleep(step_delay * (3 if peer.rank == slow_rank else 1))  # a bigger model's compute
        step.backward(loss)
    return [p.detach().cpu().clone() for p in model.parameters()], job


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=60, help="at most; a --sizes schedule ends earlier")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sizes", nargs="*", type=int, default=[])
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument(
        "--stop-at-version", type=int, default=0, help="stop once the cluster reaches this config version"
    )
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--policy", default="", choices=["", "cycle", "raise", "topology"])
    parser.add_argument(
        "--strategy", default="", choices=["", "sync_sgd", "model_averaging", "pair_averaging", "local_sgd"]
    )
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank's steps take 3x --step-delay")
    parser.add_argument(
        "--pause",
        nargs=3,
        type=float,
        default=None,
        metavar=("RANK", "STEP", "SECONDS"),
        help="rank RANK is busy for SECONDS at step STEP before its forward (an evaluation)",
    )
    parser.add_argument("--device", default="cpu", help="where the model and batches live (cuda: tests/gpu)")
    args = parser.parse_args()
    taiji.log.configure_logging("INFO")
    peer = taiji.init()
    worker = os.environ["TAIJI_WORKER_ID"]
    params, job = train(
        peer,
        args.steps,
        args.batch,
        args.sizes,
        args.every,
        args.step_delay,
        args.out / f"{worker}.jsonl",
        args.stop_at_version,
        args.policy,
        args.strategy,
        args.slow_rank,
        args.pause,
        args.device,
    )
    with open(args.out / f"{worker}.transitions.json", "w") as f:
        json.dump(job.transitions, f)
    if peer.rank == 0:
        torch.save(params, args.out / "final.pt")
