"""What taiji's commands print when they cannot go on: one line that says what failed and what to
do — never torch's C++ log lines and stack frames, nor wording meant for workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from taiji.cluster import auth

pytestmark = pytest.mark.timeout(120)


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(tmp_path, target: str, secret_file) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}  # as a user's shell has it
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "join",
            target,
            "--secret-file",
            str(secret_file),
            "--nproc-per-node",
            "1",
            "--host",
            "127.0.0.1",
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=dict(env, TAIJI_HOME=str(tmp_path)),
    )


def test_an_unreachable_store_is_one_clear_line(tmp_path):
    secret = auth.write_secret_file(tmp_path / "job.secret", auth.new_secret())
    done = _join(tmp_path, f"jx@127.0.0.1:{_closed_port()}", secret)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("taiji: error: cannot reach the job store at 127.0.0.1:"), lines
    assert "connection refused" in lines[0] and "worker" not in lines[0], lines


def test_a_secret_file_that_is_not_text_is_refused_clearly(tmp_path):
    secret = tmp_path / "binary.secret"
    secret.write_bytes(bytes(range(200, 232)))
    secret.chmod(0o600)
    done = _join(tmp_path, "jx@127.0.0.1:1", secret)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a taiji job secret" in done.stderr and "Traceback" not in done.stderr, done.stderr
