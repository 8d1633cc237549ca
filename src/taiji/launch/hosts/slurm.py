"""What a task started by Slurm knows of its job: the allocation read from Slurm's environment
(pure functions of a mapping, no processes), and Slurm's host-list syntax expanded.

`taiji run --slurm` runs as one task per node (``srun --ntasks-per-node 1``): task 0
(``SLURM_PROCID``) becomes the launcher, every other task an agent of its node
(launch/hosts/slurm_task.py). ``--nnodes`` comes from the step's node count, each node's address from
its name in the node list.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ... import env
from ...errors import ConfigError

OUTSIDE = (
    "--slurm needs a Slurm allocation ({var} is not set): start it with "
    "`srun --nodes N --ntasks-per-node 1 taiji run --slurm ...`, from an `sbatch` script or `salloc`"
)


@dataclass(frozen=True)
class Allocation:
    """This task's place in its Slurm job (step)."""

    job: str  # SLURM_JOB_ID
    step: str  # SLURM_STEP_ID ("" outside an srun step: the batch script)
    restart: int  # SLURM_RESTART_COUNT: a requeued job runs again under the same id
    procid: int  # SLURM_PROCID: this task's rank in the step
    ntasks: int  # tasks in the step
    nodeid: int  # SLURM_NODEID: this node's index in the step's node list
    nodes: tuple[str, ...]  # the step's nodes, expanded, in Slurm's order
    node: str  # SLURMD_NODENAME: this task's node
    submit_dir: str  # SLURM_SUBMIT_DIR
    gpus_on_node: int = 0  # SLURM_GPUS_ON_NODE

    @property
    def launches(self) -> bool:
        """Task 0 runs the job's launcher; the others join it."""
        return self.procid == 0


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """``a[1-2],b,c[3,5]`` -> ``['a[1-2]', 'b', 'c[3,5]']``: commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"bad Slurm host list {text!r}: nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"bad Slurm host list {text!r}: ']' without '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"bad Slurm host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _expand_one(pattern: str, whole: str) -> list[str]:
    """One host expression, e.g. ``rack[1-2]-n[01-03]`` (the product of its bracket groups)."""
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.index("]", open_at)
    head, body, tail = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ConfigError(f"bad Slurm host list {whole!r}: {item!r} is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ConfigError(f"bad Slurm host list {whole!r}: the range {item!r} goes down")
        width = len(low) if low.startswith("0") else 0  # n[01-10]: zero-padded to two digits
        values += [f"{n:0{width}d}" for n in range(int(low), int(high) + 1)]
    return [head + value + rest for value in values for rest in _expand_one(tail, whole)]


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compressed host list (``SLURM_JOB_NODELIST``) as node names, in order, as
    `scontrol show hostnames` prints them: ``n[1-3,7],gpu[01-02]`` -> n1 n2 n3 n7 gpu01 gpu02."""
    text = text.strip()
    if not text:
        raise ConfigError("empty Slurm host list")
    names: list[str] = []
    for part in _split_top(text):
        if not part:
            raise ConfigError(f"bad Slurm host list {text!r}: an empty name")
        names += _expand_one(part, text)
    return tuple(names)


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name, "")
    if raw == "" and default is not None:
        return default
    try:
        return int(raw.split("(")[0])
    except ValueError:
        raise ConfigError(f"Slurm's {name}={raw!r} is not a number") from None


def read_allocation(environ: Mapping[str, str]) -> Allocation:
    """This task's allocation; ConfigError saying what to do when it is not an srun task."""
    job = environ.get(env.SLURM_JOB_ID.name, "")
    if not job:
        raise ConfigError(OUTSIDE.format(var=env.SLURM_JOB_ID.name))
    if not environ.get("SLURM_PROCID"):
        raise ConfigError(
            f"--slurm runs as tasks of a job step (SLURM_PROCID is not set: this is Slurm job {job}'s "
            "batch script): start it with `srun --ntasks-per-node 1 taiji run --slurm ...`"
        )
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    nodes = expand_hostlist(nodelist)
    ntasks = _int(environ, "SLURM_STEP_NUM_TASKS", _int(environ, "SLURM_NTASKS", len(nodes)))
    nodeid = _int(environ, "SLURM_NODEID", 0)
    node = environ.get("SLURMD_NODENAME") or (nodes[nodeid] if nodeid < len(nodes) else "")
    return Allocation(
        job=job,
        step=environ.get("SLURM_STEP_ID", ""),
        restart=_int(environ, "SLURM_RESTART_COUNT", 0),
        procid=_int(environ, "SLURM_PROCID"),
        ntasks=ntasks,
        nodeid=nodeid,
        nodes=nodes,
        node=node,
        submit_dir=environ.get("SLURM_SUBMIT_DIR", ""),
        gpus_on_node=_int(environ, "SLURM_GPUS_ON_NODE", 0),
    )


def check_one_task_per_node(allocation: Allocation) -> None:
    if allocation.ntasks != len(allocation.nodes):
        raise ConfigError(
            f"Slurm job {allocation.job} runs {allocation.ntasks} task(s) on {len(allocation.nodes)} "
            "node(s): taiji wants one task per node (it starts the workers itself): "
            "`srun --ntasks-per-node 1` (or `#SBATCH --ntasks-per-node=1`), and --nproc-per-node K "
            "for the workers of each node"
        )


def default_slots(allocation: Allocation) -> int:
    """Workers per node when --nproc-per-node is not given: the node's GPUs, else 1."""
    return allocation.gpus_on_node or 1


def ipv4_of(name: str, resolve: Callable[[str], list[str]] | None = None) -> str:
    """``name``'s first IPv4 address that another node can reach; ConfigError if none."""
    if resolve is None:
        resolve = _resolve
    try:
        addresses = resolve(name)
    except OSError as exc:
        raise ConfigError(
            f"cannot resolve the Slurm node name {name!r} to an address ({exc}): give "
            "--ifname NAME (the interface whose address the nodes reach each other on)"
        ) from None
    routable = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
    if not routable:
        raise ConfigError(
            f"the Slurm node name {name!r} resolves to {', '.join(addresses) or 'nothing'} here, a "
            "loopback address other nodes cannot reach (see /etc/hosts): give --ifname NAME"
        )
    return routable[0]


def _resolve(name: str) -> list[str]:
    found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def check_nodes_resolve(
    nodes: tuple[str, ...], resolve: Callable[[str], list[str]] | None = None
) -> dict[str, str]:
    """Every node's address (the launcher checks the whole node list before anything starts);
    ConfigError naming each node that does not resolve to a reachable address."""
    found, problems = {}, []
    for name in nodes:
        try:
            found[name] = ipv4_of(name, resolve)
        except ConfigError as exc:
            problems.append(str(exc).split(": give")[0])
    if problems:
        raise ConfigError(
            "the launcher cannot resolve the job's node list: "
            + "; ".join(problems)
            + ": give --ifname NAME (each node then advertises that interface's address)"
        )
    return found
