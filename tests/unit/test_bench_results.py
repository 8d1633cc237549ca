"""Benchmark results as data: print_result records the result line with its provenance under
benchmarks/results/ (or $TAIJI_BENCH_RESULTS), and every benchmark has a recorded result that the
docs' Benchmarks page can render."""

from __future__ import annotations

import json
import re
import sys

import pytest

from taiji_harness import results
from taiji_harness.bench import contract_row, print_result
from taiji_harness.testing import BENCHMARKS, REPO

SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_print_result_records_the_line_with_its_provenance(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))
    row = contract_row("a", 3.0, 1.5, higher_is_better=True)
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "allreduce.py"), "--quick"])
    print_result("demo", [row], reps=2)
    line = capsys.readouterr().out.splitlines()[-1]
    entry = json.loads((tmp_path / "demo.json").read_text())
    assert entry["result"] == json.loads(line)  # the printed line, as data
    assert entry["source"] == "run" and entry["benchmark"] == "demo"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry["date"])
    assert re.fullmatch(r"[0-9a-f]{7,}\+?", entry["commit"])
    assert "CPUs" in entry["machine"] and len(entry["load_average"]) == 3
    assert entry["command"] == "python benchmarks/allreduce.py --quick"
    assert results.load_all(tmp_path) == [entry]


def test_a_run_of_some_cases_is_recorded_beside_a_run_of_others(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))
    row = contract_row("a", 3.0, 1.5, higher_is_better=True)
    for argv in (
        ["multihost.py", "--quick"],
        ["multihost.py", "--cases", "preempt,faults"],
        ["multihost.py", "--cases=faults,preempt", "--reps", "3"],
    ):
        monkeypatch.setattr(sys, "argv", argv)
        print_result("multihost", [row])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multihost.faults+preempt.json", "multihost.json"]
    entries = results.load_all(tmp_path)
    assert [e.get("cases") for e in entries] == ["faults+preempt", None]
    assert entries[0]["command"].endswith("--cases=faults,preempt --reps 3")


def test_the_command_names_the_script_relative_to_the_repository():
    assert (
        results.command([str(BENCHMARKS / "elastic.py"), "--quick", "--reps", "1"])
        == "python benchmarks/elastic.py --quick --reps 1"
    )
    assert results.command(["/elsewhere/x.py", "a b"]) == "python /elsewhere/x.py 'a b'"


def test_workers_and_skipped_runs_record_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path))
    print_result("worker", [contract_row("a", 1.0, 1.0, higher_is_better=True)], record=False)
    print_result("skipped", [], skipped="no etcd binary")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(results.RESULTS_ENV, "")  # recording off
    assert results.record({"benchmark": "x", "rows": [{"case": "a"}]}) is None


def test_load_all_refuses_a_malformed_file(tmp_path):
    (tmp_path / "x.json").write_text(
        json.dumps(
            {
                "benchmark": "x",
                "source": "guess",
                "date": "",
                "commit": "",
                "machine": "",
                "command": "",
                "result": {},
            }
        )
    )
    with pytest.raises(ValueError, match="x.json"):
        results.load_all(tmp_path)


def test_every_benchmark_has_a_recorded_result():
    recorded = {entry["benchmark"]: entry for entry in results.load_all()}
    missing = sorted(set(SCRIPTS) - set(recorded))
    assert not missing, (
        f"no result in benchmarks/results/ for {missing}: run the benchmark (its --quick mode "
        "records one), then commit the file"
    )
    for name, entry in recorded.items():
        assert name in SCRIPTS, f"benchmarks/results/{name}.json names no benchmark"
        assert entry["result"]["rows"], f"{name}: a result without rows"
        assert entry["command"].startswith(f"python benchmarks/{name}.py"), entry["command"]
    assert results.RESULTS_DIR == REPO / "benchmarks" / "results"
