"""The launcher's side of checkpoints: `taiji run`'s checkpoint flags, what a stopped job tells
its user, and `taiji checkpoint show | export`.

`taiji run --checkpoint-dir PATH [--checkpoint-every 10m|N] [--resume auto|PATH]` is every
Job's default (a Job's own ``taiji.Checkpoint`` wins). SIGTERM to such a launcher stops the job
at the next step boundary with a final checkpoint (the launcher passes the notice on to its
workers as ``NOTICE_SIGNAL``: a worker's own SIGTERM stays a worker's death, recovered from),
then exits ``EXIT_RESUMABLE``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..checkpoint.config import NOTICE_SIGNAL, parse_every
from ..checkpoint.layout import checkpoint_name
from ..checkpoint.locate import find
from ..checkpoint.storage import Storage, is_url
from ..errors import CheckpointError, ConfigError
from .options import CheckpointFlags
from .supervisor import Supervisor

EXIT_RESUMABLE = 75  # EX_TEMPFAIL: stopped on a notice; a complete checkpoint lets the job resume
EXIT_STOPPED_UNSAVED = 128 + 15  # stopped on SIGTERM with no complete checkpoint: nothing to resume from
LISTING_POLL_S = 0.1  # how often a stopping launcher looks for other hosts' parts of the final checkpoint


def add_run_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("checkpoints (every Job's default; a Job's own taiji.Checkpoint wins)")
    group.add_argument(
        "--checkpoint-dir",
        default="",
        metavar="PATH|URL",
        help="where the job checkpoints (a shared directory or an fsspec URL such as s3://b/run); "
        "SIGTERM then stops the job with a final checkpoint and exit status 75 (resumable)",
    )
    group.add_argument(
        "--checkpoint-every",
        default="",
        metavar="10m|N",
        help="checkpoint every duration (90s, 10m, 2h) or every N steps (default: only a final "
        "one when training stops)",
    )
    group.add_argument(
        "--resume",
        default="",
        metavar="auto|PATH",
        help="start from a checkpoint: auto = the latest complete one in --checkpoint-dir (none: "
        "a fresh start), or a checkpoint or checkpoint directory",
    )
    group.add_argument(
        "--checkpoint-grace",
        type=float,
        default=CheckpointFlags.grace,
        metavar="SECONDS",
        help="after SIGTERM, how long the workers have to reach a step boundary and write the "
        "final checkpoint before they are killed (default: %(default)s)",
    )


def parse_run_flags(args: argparse.Namespace) -> CheckpointFlags:
    """Check the flags now (a bad path is refused before any worker starts)."""
    directory = args.checkpoint_dir
    if directory and not is_url(directory):
        directory = str(Path(directory).resolve())
    if args.checkpoint_every:
        if not directory:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir")
        parse_every(args.checkpoint_every)
    resume = args.resume
    if resume == "auto" and not directory:
        raise ConfigError("--resume auto needs --checkpoint-dir (where to look for the latest checkpoint)")
    if resume and resume != "auto":
        resume = resume if is_url(resume) else str(Path(resume).resolve())
        find(resume)  # refuses a missing, incomplete or newer-format checkpoint now
    if directory:
        Storage(directory).check_writable()
    if args.checkpoint_grace <= 0:
        raise ConfigError(f"--checkpoint-grace must be positive, got {args.checkpoint_grace}")
    return CheckpointFlags(directory, args.checkpoint_every, resume, args.checkpoint_grace)


def resume_note(directory: str, resume: str) -> str | None:
    """What the launcher says at the start about ``--resume`` (None: nothing to say): the
    checkpoint the workers resume from (that of a Job whose own ``taiji.Checkpoint`` says
    otherwise wins), or that ``--resume auto`` found none and the job starts fresh."""
    if not resume:
        return None
    try:
        found = find(directory if resume == "auto" else resume, missing_ok=True)
    except CheckpointError as exc:
        return f"--resume {resume}: {exc}"
    if found is None:
        return f"--resume auto: no complete checkpoint in {directory} yet: a fresh start"
    m = found.manifest
    return (
        f"resuming from {found.url} (step {found.step}, written by {m.size} worker(s)); the run log's "
        "`resume` event has the details"
    )


def stop_workers(
    signum: int,
    sup: Supervisor,
    directory: str,
    grace: float,
    checkpoint_grace: float,
    say: Callable[[str], None],
    elsewhere: int = 0,
) -> int:
    """The launcher received ``signum``: stop this host's workers (``elsewhere``: how many run on
    the other hosts, which their agents stop); returns the launcher's status. SIGTERM with a
    checkpoint directory is a preemption notice: the workers get ``NOTICE_SIGNAL`` and up to
    ``checkpoint_grace`` seconds to stop at a step boundary after a final checkpoint."""
    saving = signum == signal.SIGTERM and bool(directory)
    here = len(sup.running())
    where = f" ({here} here, {elsewhere} on other hosts)" if elsewhere else ""
    say(
        f"received {signal.Signals(signum).name}; stopping {here + elsewhere} worker(s){where}"
        + (
            f" at the next step boundary, after a final checkpoint in {directory}"
            if saving
            else ""
            if directory
            else "; no --checkpoint-dir was given: nothing was saved"
        )
    )
    if saving:
        sup.drain(NOTICE_SIGNAL, checkpoint_grace)
    sup.stop_all(grace)
    return stopped_on_notice(directory, say, wait=grace) if saving else 128 + signum


def stopped_on_notice(directory: str, say: Callable[[str], None], wait: float = 0.0) -> int:
    """After a notice stopped a checkpointing job: say where it can resume from, and the status.
    A newer checkpoint still being written (other hosts' workers write their parts after this
    host's are done) is waited for up to ``wait`` seconds."""
    storage = Storage(directory)
    listing, deadline = storage.listing(), time.monotonic() + wait
    while (
        listing.incomplete
        and (listing.latest is None or listing.incomplete[-1] > listing.latest)
        and time.monotonic() < deadline
    ):
        time.sleep(LISTING_POLL_S)
        listing = storage.listing()
    latest = listing.latest
    if latest is None:
        say(f"stopped; no complete checkpoint in {directory}: nothing to resume from")
        return EXIT_STOPPED_UNSAVED
    say(
        f"stopped, resumable from {storage.url_of(checkpoint_name(latest))} (step {latest}): rerun with "
        f"`taiji run --checkpoint-dir {directory} --resume auto ...` at any size"
    )
    return EXIT_RESUMABLE


# -- taiji checkpoint ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The parser of `taiji checkpoint show | export`."""
    parser = argparse.ArgumentParser(prog="taiji checkpoint", description="inspect and export checkpoints")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    show = sub.add_parser("show", help="a checkpoint's manifest (step, size, model)")
    show.add_argument("path", metavar="PATH", help="a checkpoint, or a directory of them (its latest)")
    export = sub.add_parser("export", help="one torch.save file: model, optimizer, training state, manifest")
    export.add_argument("path", metavar="PATH", help="a checkpoint, or a directory of them (its latest)")
    export.add_argument("out", metavar="OUT.pt")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from ..checkpoint import reader

    try:
        if args.command == "show":
            found = reader.find(args.path)
            assert found is not None
            m = found.manifest
            print(
                f"{found.url}: step {m.step}, written by {m.size} worker(s) in {m.parts} part(s), taiji "
                f"{m.taiji_version}, format {m.format}, strategy {m.strategy or '?'}, "
                f"{len(m.model)} model tensors"
            )
            return 0
        found = reader.export(args.path, args.out)
        print(f"taiji: wrote {args.out} (step {found.step} of {found.url})")
        return 0
    except (CheckpointError, ConfigError, OSError) as exc:
        sys.stderr.write(f"taiji checkpoint: error: {exc}\n")
        return 2
