"""Every server a job starts listens only on the job's address (issue 15's security fix): the
launcher's store, each worker's gloo pairs and the p2p model store of PairAveraging."""

import os
import subprocess
import sys
import time

import pytest

from taiji_harness.testing import ELASTIC_SCRIPT, REPO, listening_addresses, stop_launcher

pytestmark = [pytest.mark.timeout(120)]


def test_a_running_job_listens_on_loopback_only(tmp_path):
    args = [
        sys.executable,
        "-m",
        "taiji.launch.cli",
        "run",
        "-np",
        "2",
        "--",
        sys.executable,
        ELASTIC_SCRIPT,
        str(tmp_path),
        "--steps",
        "100000",
        "--step-delay",
        "0.005",
        "--strategy",
        "pair_averaging",
    ]
    env = dict(os.environ, TAIJI_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    output = open(tmp_path / "launcher.log", "w")
    launcher = subprocess.Popen(
        args, stdout=output, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
    )
    try:
        # both workers have trained a while (PairAveraging has fetched): every server is up
        deadline = time.monotonic() + 60
        while (
            not (tmp_path / "w1.jsonl").exists() or len((tmp_path / "w1.jsonl").read_text().splitlines()) < 30
        ):
            assert time.monotonic() < deadline and launcher.poll() is None, (
                "the job did not train: " + (tmp_path / "launcher.log").read_text()[-3000:]
            )
            time.sleep(0.2)
        addresses = listening_addresses(launcher.pid)
        assert len(addresses) >= 3, f"expected the store and each worker's servers, found {addresses}"
        assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
    finally:
        output.close()
        stop_launcher(launcher)
