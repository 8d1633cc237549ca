"""`taiji sched simulate` end to end on a tiny synthetic workload and cluster: exit code, the summary
table, the JSON(L) files and PNGs; and bad input ending in one line on stderr with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taiji.launch.cli import main as taiji_main
from taiji.sched.cli import parse_cost, uniform_cost
from taiji.sched.costs import SYSTEMS
from taiji.sched.policyrun import configured_policy

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--workload", "synthetic", "--jobs", "8", "--duration-h", "0.5", "--cluster", "2x4", "--seed", "3"]


def simulate(*args: str) -> int:
    return taiji_main(["sched", "simulate", *args])


def test_two_baselines_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    assert simulate(*TINY, "--policy", "fifo,tiresias", "--out", str(out)) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    header = next(line for line in lines if "avg JCT s" in line)
    for column in ("policy", "p99 JCT s", "makespan h", "GPU-hours", "restarts", "decision ms/round"):
        assert column in header
    assert any(line.split()[:1] == ["fifo"] for line in lines)
    assert any(line.split()[:1] == ["tiresias"] for line in lines)
    assert "job" in captured.err  # the progress bars go to stderr
    for policy in ("fifo", "tiresias"):
        jobs = [json.loads(line) for line in (out / f"{policy}.jobs.jsonl").read_text().splitlines()]
        assert len(jobs) == 8 and {job["status"] for job in jobs} <= {"done", "rejected", "unfinished"}
        detail = json.loads((out / f"{policy}.summary.json").read_text())
        assert detail["summary"]["policy"] == policy and detail["summary"]["jobs"] == 8
        assert detail["summary"]["decision"]["rounds"] > 0
        for job in jobs:  # a completed job's allocation drops to 0 exactly at its completion
            if job["status"] == "done":
                assert detail["allocations"][job["name"]][-1] == [job["end_time"], 0]
    overall = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in overall["policies"]] == ["fifo", "tiresias"]
    assert overall["settings"]["cluster"] == "2x4"
    for png in ("jct_cdf.png", "utilization.png", "allocations-fifo.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC


def test_same_seed_same_files(tmp_path):
    for run in ("a", "b"):
        assert (
            simulate(
                *TINY,
                "--policy",
                "srtf",
                "--cost",
                "taiji",
                "--quiet",
                "--no-plots",
                "--out",
                str(tmp_path / run),
            )
            == 0
        )
    assert (tmp_path / "a" / "srtf.jobs.jsonl").read_text() == (
        tmp_path / "b" / "srtf.jobs.jsonl"
    ).read_text()
    assert not list((tmp_path / "a").glob("*.png"))


def test_fidelity_mode_reaches_the_policies_and_the_settings(tmp_path):
    out = tmp_path / "out"
    assert (
        simulate(
            *TINY,
            "--policy",
            "tiresias,optimus",
            "--fidelity",
            "pollux",
            "--quiet",
            "--no-plots",
            "--out",
            str(out),
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["settings"]["fidelity"] == "pollux"
    assert (
        configured_policy("optimus", seed=0, resize=SYSTEMS["restart"], fidelity="pollux").fidelity
        == "pollux"
    )
    assert configured_policy("tiresias", seed=0, resize=SYSTEMS["restart"]).fidelity == "taiji"


def test_python_dash_m_entry_point(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "taiji.launch.cli",
            "sched",
            "simulate",
            *TINY,
            "--policy",
            "fifo",
            "--quiet",
            "--no-plots",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "avg JCT s" in done.stdout and (tmp_path / "fifo.jobs.jsonl").exists()


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown-policy", "unknown policy 'nope'"),
        ("bad-cluster", "cluster '4by4'"),
        ("empty-cluster", "a cluster needs >= 1 host"),
        ("missing-file", "cannot read"),
        ("malformed-row", ":3: 4 fields, expected 5"),
        ("unknown-application", "unknown application 'gpt9'"),
        ("bad-pollux-index", "pollux:1..pollux:8"),
        ("bad-cost", "--cost 'fast'"),
        ("plot-policy-not-run", "--plot-policy 'srtf'"),
        ("no-workload", "required: --workload"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, message):
    header = "name,time,application,num_replicas,batch_size\n"
    workload = {
        "missing-file": str(tmp_path / "absent.csv"),
        "malformed-row": write(tmp_path / "bad.csv", header + "a,0,bert,2,384\nb,0,bert,2\n"),
        "unknown-application": write(tmp_path / "app.csv", header + "a,0,gpt9,2,384\n"),
        "bad-pollux-index": "pollux:9",
    }.get(case, "synthetic")
    policy = "fifo,nope" if case == "unknown-policy" else "fifo"
    args = [
        "--policy",
        policy,
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--cluster",
        {"bad-cluster": "4by4", "empty-cluster": "0x4"}.get(case, "2x4"),
        "--cost",
        "fast" if case == "bad-cost" else "restart",
    ]
    if case != "no-workload":
        args += ["--workload", workload]
    if case == "plot-policy-not-run":
        args += ["--plot-policy", "srtf"]
    try:
        code = simulate(*args)
    except SystemExit as exited:  # argparse's own errors (a missing option) exit instead of returning
        code = exited.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("taiji sched: error:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cost_names_and_seconds():
    assert parse_cost("restart") == SYSTEMS["restart"] and parse_cost("taiji") == SYSTEMS["taiji"]
    assert parse_cost("2") == uniform_cost(2.0) == parse_cost("2.0")
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ValueError, match="seconds per change"):
            parse_cost(bad)


def test_taiji_help_lists_sched(capsys):
    with pytest.raises(SystemExit):
        taiji_main(["--help"])
    assert "sched" in capsys.readouterr().out


def test_missing_scheduler_dependency_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "taiji.sched.cli", None)  # what a missing SciPy looks like to the import
    assert simulate(*TINY, "--policy", "fifo") == 2
    err = capsys.readouterr().err
    assert err.startswith("taiji sched: error:") and "taiji[sched]" in err and len(err.splitlines()) == 1
