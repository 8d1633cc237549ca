"""`taiji --help` lists every command `taiji` runs (the parser is walked, so a command added
without a listing fails here), each command's `--help` works, and a command refused for its
shape names a form that is accepted."""

from __future__ import annotations

import argparse
import re

import pytest

from taiji.errors import ConfigError
from taiji.launch import arguments, cli
from taiji.launch.hosts.ray import nodes as ray_nodes
from taiji.launch.parser import build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_lists_every_command_including_those_with_parsers_of_their_own(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    listing = capsys.readouterr().out
    commands = _commands(build_parser())
    assert set(cli.OWN_PARSERS) <= set(commands), "a command main() runs is missing from the parser"
    for name in commands:
        assert re.search(rf"^\s+{name}\b", listing, re.M), f"`taiji --help` does not list {name}:\n{listing}"
    assert {"run", "join", "resize", "status", "ls", "top", "drain", "plot", "checkpoint", "sched"} <= set(
        commands
    )


@pytest.mark.parametrize("name", sorted(_commands(build_parser())))
def test_each_commands_help_works(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"]) if name != "sched" else cli.main([name, "simulate", "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def _parse(*argv: str):
    args = build_parser().parse_args(["run", *argv, "python", "-c", "pass"])
    ray_nodes.fill_defaults(args)
    return arguments.parse_run(args)


def _suggested(message: str) -> list[list[str]]:
    """The forms a refusal suggests: its `...` quoted command lines (`taiji run ...` or flags)."""
    return [text.split() for text in re.findall(r"`((?:taiji run )?-[^`]*)`", message)]


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no size at all
        ["-np", "2", "--nproc-per-node", "1", "--max-np", "3"],  # more than this host's slots
        ["-np", "5", "--nnodes", "2:3", "--nproc-per-node", "2"],
    ],
)
def test_a_refused_shape_names_forms_that_are_accepted(argv):
    with pytest.raises(ConfigError) as refused:
        _parse(*argv)
    forms = _suggested(str(refused.value))
    assert forms, str(refused.value)
    for form in forms:
        words = [w for w in form if w not in ("taiji", "run", "python", "train.py")]
        _parse(*words)  # accepted


def test_nproc_per_node_alone_starts_that_many_here_and_grows_up_to_max_np():
    cfg = _parse("--nproc-per-node", "1", "--max-np", "8")
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts, cfg.nproc_per_node) == (1, 8, 1, 1)


def test_on_ray_np_beyond_this_nodes_slots_waits_for_the_nodes_that_hold_them():
    cfg = _parse("--ray", "10.0.0.1:6379", "-np", "2", "--nproc-per-node", "1", "--max-np", "3")
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts, cfg.max_hosts) == (2, 3, 2, 3)
    cfg = _parse("--ray", "10.0.0.1:6379", "-np", "4", "--nproc-per-node", "2")
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts, cfg.max_hosts) == (4, 4, 2, 2)
    cfg = _parse("--ray", "10.0.0.1:6379", "--nproc-per-node", "1", "--max-np", "8")  # ray.md's first command
    assert (cfg.nproc, cfg.max_np, cfg.min_hosts) == (1, 8, 1)
    with pytest.raises(ConfigError, match="--ray needs --nproc-per-node K.*--nproc-per-node 1 --max-np 8"):
        _parse("--ray", "10.0.0.1:6379", "-np", "2", "--max-np", "3")


def test_requeue_is_for_slurm_only():
    with pytest.raises(ConfigError, match="--requeue is for `srun taiji run --slurm`"):
        _parse("-np", "1", "--requeue")
