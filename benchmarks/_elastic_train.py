"""The training script of ``benchmarks/elastic.py``, run under ``taiji run`` or under torchrun.

    taiji run -np 1 --max-np 4 -- python benchmarks/_elastic_train.py OUT [--step-delay S]
    torchrun --standalone --nproc-per-node 2 benchmarks/_elastic_train.py OUT --checkpoint CKPT
    REPLICA_GROUP_ID=i NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://127.0.0.1:P \
        torchrun --standalone --nproc-per-node 1 benchmarks/_elastic_train.py OUT

All sides train the same model (an MLP 512 -> 1024 -> 512 -> 10, 1.05M fp32 parameters, SGD
with momentum) on the same synthetic data with the same global batch, split over the workers.

- Under ``taiji run`` (``TAIJI_STORE_PORT`` set) it is a ``taiji.Job`` loop: membership
  changes happen inside the running processes.
- Under torchrun it is plain ``torch.distributed`` + DDP (gloo). Rank 0 checkpoints model,
  optimizer and step after every step (written to a temporary file, then renamed), and every
  worker resumes from the checkpoint when it starts: a membership change is a restart.
- Under torchrun with ``TORCHFT_LIGHTHOUSE`` set it is one replica group of torchft (one worker,
  configured as torchft's ``train_ddp.py`` example: ``Manager`` with ``min_replica_size=1`` and
  a ``PGTransport`` for live recovery, ``ProcessGroupGloo`` with a 5 s timeout, its
  ``DistributedDataParallel`` and ``Optimizer`` wrappers, and its ``DistributedSampler`` sharding
  the data per replica group). Each group takes global batch / ``NUM_REPLICA_GROUPS`` samples per
  step; a step the Manager does not commit is skipped, not retried.

Every process appends JSON lines to ``OUT/<side>-<pid>.jsonl``: one ``boot`` record (wall-clock
times at exec, after ``import torch``, when it joined, when its model and optimizer were built,
when its state was loaded or the Job built, when its first step began; the process's CPU seconds
by then) and one
``commit`` record per committed step with its wall-clock ``time``, the step index, the
cluster size and rank. With ``--log-samples`` each process also writes a ``draw`` record when a
step takes its batch, and ``draw`` and ``commit`` records carry the batch's sample indices and
epoch: what the exactly-once figures are made of. ``benchmarks/elastic.py`` reads these files while
the job runs.

Training stops at the next step boundary once the file ``OUT/stop`` exists (taiji: rank 0
sees it and asks the Job to stop, so every worker stops at the same step), or at
``--max-steps``. torchrun and torchft jobs are simply stopped from outside (torchrun's resize path).
"""

import time

EXEC_TIME = time.time()  # before anything heavy: when this process began running Python

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from taiji_harness.bench import watch_parent  # noqa: E402

IMPORT_TIME = time.time()

FEATURES, HIDDEN, CLASSES = 512, (1024, 512), 10
NUM_SAMPLES = 8192


def make_model() -> torch.nn.Module:
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN[0]),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN[0], HIDDEN[1]),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN[1], CLASSES),
    )


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(NUM_SAMPLES, FEATURES, generator=g), torch.randint(
        0, CLASSES, (NUM_SAMPLES,), generator=g
    )


def state_bytes(model: torch.nn.Module) -> dict:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "model_state_bytes": params,
        "train_state_bytes": 2 * params,
    }  # + one momentum buffer per parameter


class Log:
    """One JSON object per line in OUT/<side>-<pid>.jsonl (the file name tells the parent our pid)."""

    def __init__(self, out: Path, side: str, tag: str):
        self.file = open(out / f"{side}-{os.getpid()}.jsonl", "a")
        self.tag = tag

    def write(self, **record) -> None:
        self.file.write(json.dumps({**record, "tag": self.tag}) + "\n")
        self.file.flush()


def samples(args: argparse.Namespace, indices: torch.Tensor, epoch: int) -> dict:
    """The sample indices and epoch of one batch, for a step-log record (with ``--log-samples``)."""
    return {"samples": indices.tolist(), "epoch": epoch} if args.log_samples else {}


def exit_with_parent() -> None:
    """torchrun starts workers in their own sessions and does not make them die with it: exit
    at once if the agent that started us dies, so that no worker outlives its launcher."""
    watch_parent(os.getppid())


def taiji_main(args: argparse.Namespace) -> None:
    from torch.utils.data import TensorDataset

    import taiji

    log = Log(args.out, "taiji", args.tag)
    peer = taiji.init()
    marks = {"joined": time.time()}
    model = make_model()
    opt = make_optimizer(model)
    marks["built"] = time.time()
    boot = {"exec": EXEC_TIME, "imported": IMPORT_TIME, "worker": peer.worker_id}
    seen_transitions = 0

    def on_commit(step) -> None:
        nonlocal seen_transitions
        record = {
            "event": "commit",
            "step": step.index,
            "size": peer.size,
            "rank": peer.rank,
            "version": peer.version,
            "pid": os.getpid(),
            "worker": peer.worker_id,
            "time": time.time(),
            "began": phases["began"],
            "backward_done": phases["backward_done"],
            **samples(args, step.indices, step.epoch),
        }
        if len(job.transitions) > seen_transitions:  # the first commit after a membership change
            record["transitions"] = job.transitions[seen_transitions:]
            seen_transitions = len(job.transitions)
        log.write(**record)

    policies = [taiji.policies.AdaptiveTopology(trial_steps=5)] if args.adaptive_topology else []
    job = taiji.Job(
        model,
        opt,
        TensorDataset(*make_data()),
        batch_size=args.batch,
        epochs=10**6,
        max_steps=args.max_steps,
        peer=peer,
        monitoring=taiji.MonitorOptions(log_every=0),
        on_commit=on_commit,
        policies=policies,
    )
    marks["loaded"] = time.time()  # the Job is built (with a checkpoint to resume: loaded)
    stop = args.out / "stop"
    first = True
    phases = {"began": 0.0, "backward_done": 0.0}  # when the loop body got the step / backward returned
    for step in job:
        phases["began"] = time.time()
        if first:  # joined (a joiner: admitted and synced) and about to run its first step
            log.write(
                event="boot",
                side="taiji",
                pid=os.getpid(),
                rank=peer.rank,
                size=peer.size,
                ready=time.time(),
                cpu=time.process_time(),
                **boot,
                **marks,
                **state_bytes(model),
            )
            first = False
        if peer.rank == 0 and stop.exists():
            job.request_stop()
        if args.log_samples:
            log.write(
                event="draw",
                worker=peer.worker_id,
                step=step.index,
                version=peer.version,
                time=time.time(),
                **samples(args, step.indices, step.epoch),
            )
        x, y = step.batch
        loss = F.cross_entropy(model(x), y)
        if args.step_delay:
            time.sleep(args.step_delay)  # stands in for a bigger model's compute
        step.backward(loss)  # includes waiting for the gradient allreduce
        phases["backward_done"] = time.time()
    log.write(
        event="done", pid=os.getpid(), worker=peer.worker_id, time=time.time(), transitions=job.transitions
    )


def torchrun_main(args: argparse.Namespace) -> None:
    import datetime

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    exit_with_parent()
    log = Log(args.out, "torchrun", args.tag)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # a generous timeout while the workers start (their imports may finish seconds apart on a busy
    # machine), then the requested one for training's collectives, on a group of the same workers
    start_timeout = datetime.timedelta(seconds=max(args.timeout, 120.0))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's workers share the agent's store across restarts, and torch 2.13 adds no
        # per-restart prefix there: a restarted rank can read the previous attempt's gloo
        # address of a peer and fail with "Connection refused". Prefix it by the restart count.
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=start_timeout
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"restart{restart}", store),
            rank=rank,
            world_size=size,
            timeout=start_timeout,
        )
    else:
        dist.init_process_group("gloo", timeout=start_timeout)
    group = dist.new_group(timeout=datetime.timedelta(seconds=args.timeout))
    joined = time.time()
    model = make_model()
    opt = make_optimizer(model)  # the first optimizer pulls in lazy imports (torch._dynamo): ~1 s here
    built = time.time()
    step = 0
    ckpt = args.checkpoint
    if ckpt is not None and ckpt.exists():  # resume: every worker reads the last checkpoint
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        step = saved["step"]
    loaded = time.time()
    ddp = DDP(model, process_group=group)  # broadcasts rank 0's parameters
    ready = time.time()
    log.write(
        event="boot",
        side="torchrun",
        pid=os.getpid(),
        rank=rank,
        size=size,
        restart=restart,
        exec=EXEC_TIME,
        imported=IMPORT_TIME,
        joined=joined,
        built=built,
        loaded=loaded,
        ready=ready,
        cpu=time.process_time(),
        resumed_at=step,
        **state_bytes(model),
    )
    x_all, y_all = make_data()
    perm = torch.randperm(NUM_SAMPLES, generator=torch.Generator().manual_seed(11))
    share = args.batch // size
    measured_bcast = False
    while args.max_steps is None or step < args.max_steps:
        lo = (step * args.batch + rank * share) % NUM_SAMPLES
        idx = perm[lo : lo + share]
        loss = F.cross_entropy(ddp(x_all[idx]), y_all[idx])
        if args.step_delay:
            time.sleep(args.step_delay)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if rank == 0 and ckpt is not None:  # checkpoint every step: a restart loses no commit
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        log.write(
            event="commit",
            step=step - 1,
            size=size,
            rank=rank,
            restart=restart,
            pid=os.getpid(),
            time=time.time(),
        )
        if args.measure_broadcast and not measured_bcast and size > 1:
            # reference for "state transfer at broadcast bandwidth": raw gloo broadcast of a
            # buffer as large as the training state (parameters + momentum), after the first step
            measured_bcast = True
            buf = torch.zeros(state_bytes(model)["train_state_bytes"] // 4)
            times = []
            for _ in range(args.measure_broadcast):
                dist.barrier()
                t0 = time.perf_counter()
                dist.broadcast(buf, 0)
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                times.append(elapsed.item())
            if rank == 0:
                log.write(event="broadcast", size=size, bytes=buf.numel() * 4, seconds=sorted(times))
    dist.destroy_process_group()


def torchft_main(args: argparse.Namespace) -> None:
    """One replica group of torchft (one worker), set up as torchft's ``train_ddp.py`` example does."""
    import datetime

    from torch.utils.data import DataLoader
    from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    exit_with_parent()
    replica, groups = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    log = Log(args.out, "torchft", args.tag)
    worker = f"g{replica}-{os.getpid()}"  # a replaced group keeps its id: the pid tells the processes apart
    model = make_model()
    inner = make_optimizer(model)
    x_all, y_all = make_data()
    sampler = DistributedSampler(
        range(NUM_SAMPLES),
        replica_rank=replica,
        num_replica_groups=groups,
        group_rank=0,
        num_replicas=1,
        shuffle=True,
    )
    loader = DataLoader(range(NUM_SAMPLES), batch_size=args.batch // groups, sampler=sampler)

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    pg = ProcessGroupGloo(timeout=datetime.timedelta(seconds=5))
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"bench_{replica}",
        timeout=datetime.timedelta(seconds=30),
        checkpoint_transport=PGTransport(
            pg, timeout=datetime.timedelta(seconds=10), device=torch.device("cpu")
        ),
        hostname="localhost",
    )  # advertised to the lighthouse: stay on loopback
    joined = time.time()
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    log.write(
        event="boot",
        side="torchft",
        pid=os.getpid(),
        worker=worker,
        replica=replica,
        exec=EXEC_TIME,
        imported=IMPORT_TIME,
        joined=joined,
        ready=time.time(),
        **state_bytes(model),
    )
    epoch = 0
    while args.max_steps is None or manager.current_step() < args.max_steps:
        sampler.set_epoch(epoch)
        for idx in loader:
            began = time.time()
            if args.log_samples:
                log.write(
                    event="draw",
                    worker=worker,
                    step=manager.current_step(),
                    time=began,
                    **samples(args, idx, epoch),
                )
            opt.zero_grad()  # starts the quorum of this step
            loss = F.cross_entropy(ddp(x_all[idx]), y_all[idx])
            if args.step_delay:
                time.sleep(args.step_delay)
            loss.backward()  # the allreduce goes through the Manager
            before = manager.current_step()
            opt.step()  # steps the optimizer only if the Manager commits the step
            if manager.current_step() > before:
                log.write(
                    event="commit",
                    step=before,
                    size=manager.num_participants(),
                    rank=0,
                    worker=worker,
                    pid=os.getpid(),
                    time=time.time(),
                    began=began,
                    **samples(args, idx, epoch),
                )
        epoch += 1
    manager.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the step logs")
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds of simulated compute per step")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--checkpoint", type=Path, default=None, help="torchrun: checkpoint file")
    parser.add_argument("--timeout", type=float, default=60.0, help="torchrun: collective timeout")
    parser.add_argument(
        "--adaptive-topology",
        action="store_true",
        help="taiji: the AdaptiveTopology policy (ring, hierarchical, tree) decides the allreduce plan",
    )
    parser.add_argument("--tag", default="", help="copied into every record (which launch wrote it)")
    parser.add_argument(
        "--measure-broadcast",
        type=int,
        default=0,
        help="torchrun: time this many state-sized broadcasts after the first step",
    )
    parser.add_argument(
        "--log-samples",
        action="store_true",
        help="log each step's sample indices (draw and commit records): the exactly-once figures",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if os.environ.get("TAIJI_STORE_PORT"):
        taiji_main(args)
    elif os.environ.get("TORCHFT_LIGHTHOUSE"):
        torchft_main(args)
    else:
        torchrun_main(args)


if __name__ == "__main__":
    main()
