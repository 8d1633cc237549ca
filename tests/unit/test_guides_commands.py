"""Every `taiji ...` command in the guides' shell blocks (README.md and docs/guides/{ray,slurm,
checkpoints,many-hosts}.md) goes through the real parser and the checks `taiji` makes before it
starts anything, as a user would type it: the docs cannot drift from the CLI again. Placeholders
(`<job-id>`, `PORT`, `$PWD`) are filled in; the script and the secret file the commands name are
made in a scratch directory. What needs a running cluster runs in tests/multihost: test_ray.py
runs ray.md's first command on Ray nodes, test_slurm.py slurm.md's sbatch script under Slurm."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from taiji.cluster.auth import new_secret, write_secret_file
from taiji.launch import arguments, checkpoint_cli, cli
from taiji.launch.hosts.ray import nodes as ray_nodes
from taiji.launch.parser import build_parser
from taiji.launch.sched import cli as sched_cli

ROOT = Path(__file__).resolve().parents[2]
GUIDES = (
    "README.md",
    "docs/guides/ray.md",
    "docs/guides/slurm.md",
    "docs/guides/checkpoints.md",
    "docs/guides/many-hosts.md",
)
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
FILLED = {"<job-id>": "j3f9c01ab", "10.0.0.1:PORT": "10.0.0.1:29500"}


def shell_lines(markdown: str) -> list[str]:
    """The shell lines of ``markdown``'s bash blocks: continuations joined, comments dropped."""
    lines: list[str] = []
    for block in BLOCK.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def taiji_commands(line: str) -> list[list[str]]:
    """Each `taiji ...` argv in one shell line (after `srun`, or inside a quoted `--wrap "..."`)."""
    words = shlex.split(line, comments=True)
    found: list[list[str]] = []
    for i, word in enumerate(words):
        if word == "taiji":
            found.append(words[i + 1 :])
            break
        if " " in word and "taiji " in word:
            found += taiji_commands(word)
    return found


def guide_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for name in GUIDES:
        text = (ROOT / name).read_text()
        for key, value in FILLED.items():
            text = text.replace(key, value)
        for line in shell_lines(text):
            commands += [(name, argv) for argv in taiji_commands(line)]
    return commands


COMMANDS = guide_commands()


def test_every_guide_has_its_commands_found():
    per_guide = {name: sum(1 for found, _ in COMMANDS if found == name) for name in GUIDES}
    assert all(count >= 2 for count in per_guide.values()), per_guide


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A directory like a user's: the script the commands run and the secret file they name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAIJI_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("import taiji\n")
    write_secret_file(tmp_path / "j3f9c01ab.secret", new_secret())
    return tmp_path


def _check(argv: list[str], cwd: Path) -> None:
    """What `taiji` does with ``argv`` before it starts anything (connects, spawns, binds)."""
    argv = [word.replace("$PWD", str(cwd)) for word in argv]
    if argv[0] in cli.OWN_PARSERS:
        parser = checkpoint_cli.build_parser() if argv[0] == "checkpoint" else sched_cli.build_parser()
        parser.parse_args(argv[1:])
        return
    args = build_parser().parse_args(argv)
    if (
        args.subcommand == "run" and not args.slurm
    ):  # --slurm's defaults come from the allocation: test_slurm.py
        ray_nodes.fill_defaults(args)
        arguments.parse_run(args)
    elif args.subcommand == "join" and args.slurm is None:
        arguments.parse_join(args)


@pytest.mark.parametrize("guide,argv", COMMANDS, ids=[f"{g}: {' '.join(a)[:60]}" for g, a in COMMANDS])
def test_a_guide_command_is_accepted_as_written(guide, argv, scratch):
    try:
        _check(argv, scratch)
    except SystemExit as exc:
        pytest.fail(f"{guide}: `taiji {' '.join(argv)}` is refused by the parser (exit {exc.code})")
