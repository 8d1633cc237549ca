"""Every benchmark keeps the contract of docs/design.md#performance-targets: it accepts ``--quick`` and its
last stdout line is built by the one helper in taiji_harness/bench.py, ``print_result`` (checked on the
source, without running anything); and that helper itself builds the line right."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from taiji_harness.bench import ahead_ratio, contract_row, print_result, result_line
from taiji_harness.testing import BENCHMARKS, REPO, load_benchmark

CONTRACT = "taiji_harness.bench"  # the one module that builds the result line
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def helper_path(module: str) -> Path:
    """Where a helper module the benchmarks import lives: beside them (``_x``) or in the harness."""
    if module.startswith("taiji_harness."):
        return REPO / "src" / Path(*module.split(".")).with_suffix(".py")
    return BENCHMARKS / f"{module}.py"


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def called_names(node: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def local_imports(module: ast.Module) -> dict[str, str]:
    """Names imported from the benchmarks' own modules (``from _x import name``, or the harness's):
    name -> module."""
    return {
        alias.asname or alias.name: node.module
        for node in ast.walk(module)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and (node.module == CONTRACT or helper_path(node.module).is_file())
        for alias in node.names
    }


def function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def prints_result(name: str, module: ast.Module, seen: frozenset = frozenset()) -> bool:
    """Whether calling ``name`` (a function of ``module`` or one it imports from a helper module)
    leads to ``taiji_harness.bench.print_result``."""
    imports = local_imports(module)
    if name == "print_result":
        return imports.get("print_result") == CONTRACT
    if name in imports and imports[name] != CONTRACT and imports[name] not in seen:
        helper = tree(helper_path(imports[name]))
        return prints_result(name, helper, seen | {imports[name]})
    body = function(module, name)
    return body is not None and any(prints_result(n, module, seen) for n in called_names(body) - {name})


def hand_made_contract_dicts(module: ast.Module) -> list[int]:
    """Lines with a dict literal keyed "benchmark": a result line built around the helper."""
    return [
        n.lineno
        for n in ast.walk(module)
        if isinstance(n, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "benchmark" for k in n.keys)
    ]


def test_every_benchmark_is_checked():
    assert {p.stem for p in SCRIPTS} >= {
        "adaptive_batch",
        "allreduce",
        "elastic",
        "integrations",
        "monitoring",
        "soak",
        "strategies",
        "throughput",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_accepts_quick(script):
    flags = [
        n.args[0].value
        for n in ast.walk(tree(script))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    ]
    assert "--quick" in flags, f"{script.name} has no --quick flag (flags: {flags})"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_ends_with_the_shared_result_line(script):
    module = tree(script)
    main = function(module, "main")
    assert main is not None, f"{script.name} has no main()"
    last = main.body[-1]
    assert any(prints_result(name, module) for name in called_names(last)), (
        f"{script.name}: main()'s last statement (line {last.lineno}) does not print through "
        "taiji_harness.bench.print_result"
    )
    helpers = {m for m in local_imports(module).values() if m != CONTRACT}
    for path in [script, *(helper_path(m) for m in sorted(helpers))]:
        assert not hand_made_contract_dicts(tree(path)), f"{path.name} builds a result line by hand"


def test_ratio_says_how_many_times_taiji_is_ahead():
    assert ahead_ratio(200.0, 100.0, higher_is_better=True) == 2.0  # samples/s
    assert ahead_ratio(0.5, 2.0, higher_is_better=False) == 4.0  # seconds
    assert ahead_ratio(2.0, 0.5, higher_is_better=False) == 0.25
    assert ahead_ratio(None, 1.0, higher_is_better=True) is None
    assert ahead_ratio(1.0, None, higher_is_better=False) is None
    assert ahead_ratio(0.0, 1.0, higher_is_better=False) is None  # no division by zero
    assert ahead_ratio(1.0, 0.0, higher_is_better=True) is None


def test_contract_row_computes_or_keeps_the_ratio():
    row = contract_row("busbw", 1.5, 1.2, higher_is_better=True, nproc=2)
    assert list(row)[:4] == ["case", "taiji", "anchor", "ratio"]
    assert row == {"case": "busbw", "taiji": 1.5, "anchor": 1.2, "ratio": 1.25, "nproc": 2}
    assert contract_row("stall", 0.02, 5.0, higher_is_better=False)["ratio"] == 250.0
    assert contract_row("s", 0.03, 0.1, higher_is_better=False, digits=2)["ratio"] == 3.33
    paired = contract_row("paired", 10.0, 9.0, higher_is_better=True, ratio=1.23456)
    assert paired["ratio"] == 1.235  # the caller's paired ratio, rounded
    assert contract_row("missing", None, 3.0, higher_is_better=True)["ratio"] is None


def test_result_line_shape():
    rows = [
        contract_row("a", 2.0, 1.0, higher_is_better=True),
        contract_row("b", 1.0, 4.0, higher_is_better=False),
    ]
    line = result_line("demo", rows, quick=True)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed == {
        "benchmark": "demo",
        "quick": True,
        "rows": [
            {"case": "a", "taiji": 2.0, "anchor": 1.0, "ratio": 2.0},
            {"case": "b", "taiji": 1.0, "anchor": 4.0, "ratio": 4.0},
        ],
    }
    assert list(parsed)[:2] == ["benchmark", "rows"]


@pytest.mark.parametrize("missing", ["case", "taiji", "anchor", "ratio"])
def test_result_line_rejects_a_row_without_a_contract_key(missing):
    row = {"case": "a", "taiji": 1.0, "anchor": 1.0, "ratio": 1.0}
    del row[missing]
    with pytest.raises(ValueError, match=missing):
        result_line("demo", [row])


def test_print_result_prints_the_line_last(capsys):
    print("a table for people")
    print_result("demo", [contract_row("a", 3.0, 1.5, higher_is_better=True)], reps=1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a table for people"
    assert json.loads(lines[-1]) == {
        "benchmark": "demo",
        "rows": [{"case": "a", "taiji": 3.0, "anchor": 1.5, "ratio": 2.0}],
        "reps": 1,
    }


def fixed_and_adaptive_runs(adaptive_to_target: float | None) -> dict:
    def run(to_target, train_s, accuracy):
        return {
            "to_target_train_s": to_target,
            "to_target_train_cpu_s": to_target,
            "train_s": train_s,
            "train_cpu_s": train_s,
            "final_accuracy": accuracy,
        }

    return {
        "runs": {
            "small": run(60.0, 100.0, 0.90),
            "large": run(None, 80.0, 0.10),
            "adaptive": run(adaptive_to_target, 95.0, 0.897),
        }
    }


def test_adaptive_batch_rows_compare_time_to_target_with_the_large_run():
    adaptive_batch = load_benchmark("adaptive_batch")
    rows = {row["case"]: row for row in adaptive_batch.contract_rows([fixed_and_adaptive_runs(40.0)])}
    against_large = rows["adaptive time to target vs large's whole training, wall s"]
    assert (against_large["taiji"], against_large["anchor"], against_large["ratio"]) == (40.0, 80.0, 2.0)
    assert against_large["target_met"] is True  # 2.0 >= 1 / 1.2
    assert rows["time to target: adaptive vs small, wall s"]["ratio"] == 1.5
    accuracy = rows["final test accuracy: adaptive vs small"]
    assert accuracy["accuracy_points"] == -0.3 and accuracy["target_met"] is True


def test_adaptive_batch_rows_when_the_target_is_never_reached():
    never = load_benchmark("adaptive_batch").contract_rows([fixed_and_adaptive_runs(None)])[0]
    assert never["taiji"] is None and never["ratio"] is None and never["target_met"] is False
    assert never["anchor"] == 80.0


def test_strategies_rows_put_each_strategy_against_sync_sgd_of_the_same_repetition():
    strategies = load_benchmark("strategies")

    def job(strategy, straggler, samples_per_s, accuracy):
        return {
            "strategy": strategy,
            "straggler": straggler,
            "samples_per_s": samples_per_s,
            "accuracy": accuracy,
        }

    reps = [
        [job("SyncSGD", s, 1000.0 * (1 + r), 0.90) for s in (False, True)]
        + [job("PairAveraging", s, 1500.0 * (1 + r) if s else 1000.0 * (1 + r), 0.89) for s in (False, True)]
        for r in range(2)
    ]
    rows = {row["case"]: row for row in strategies.contract_rows(reps, ["sync", "pair"])}
    assert set(rows) == {
        "pair_averaging_straggler",
        "pair_averaging_straggler_accuracy",
        "pair_averaging_no_straggler",
        "pair_averaging_no_straggler_accuracy",
    }
    straggler = rows["pair_averaging_straggler"]
    assert (straggler["taiji"], straggler["anchor"], straggler["ratio"]) == (2250.0, 1500.0, 1.5)
    assert rows["pair_averaging_no_straggler"]["ratio"] == 1.0
    assert rows["pair_averaging_straggler_accuracy"]["accuracy_points"] == -1.0


def test_scheduler_rows_at_other_loads_are_named_by_load_and_keep_the_names_at_load_1(monkeypatch):
    scheduler = load_benchmark("scheduler")
    simulated: list[tuple[str, int]] = []

    def fake_run(specs, policy, config, seed):  # no simulation: JCT grows with the workload's size
        simulated.append((policy, len(specs)))
        summary = {
            "avg_jct_s": (100.0 if policy == "pcrr" else 150.0) * len(specs),
            "p99_jct_s": 1.0,
            "makespan_s": 1.0,
            "gpu_hours": 1.0,
            "restarts": 0,
            "completed": len(specs),
            "jobs": len(specs),
        }
        return SimpleNamespace(result=SimpleNamespace(summary=lambda: summary), wall_s=0.0)

    monkeypatch.setattr(scheduler, "run_policy", fake_run)
    runs = scheduler.Runs(seed=0)
    cost = scheduler.SYSTEMS["restart"]
    at_1 = scheduler.main_rows(runs, "pcrr", ["tiresias", "optimus"], [6], cost)
    at_2 = scheduler.main_rows(runs, "pcrr", ["tiresias", "optimus"], [6], cost, load=2.0)
    at_half = scheduler.main_rows(runs, "pcrr", ["tiresias"], [6], cost, load=0.5)
    assert [row["case"] for row in at_1] == ["avg JCT: PCRR vs tiresias", "avg JCT: PCRR vs optimus"]
    assert [row["case"] for row in at_2] == [
        "avg JCT at load 2.0: PCRR vs tiresias",
        "avg JCT at load 2.0: PCRR vs optimus",
    ]
    assert [row["case"] for row in at_half] == ["avg JCT at load 0.5: PCRR vs tiresias"]
    assert at_1[0]["target"] == 1.3 and "load" not in at_1[0]
    assert (
        at_2[0]["load"] == 2.0 and "target" not in at_2[0] and "reconstructed" in at_2[0]["workload_source"]
    )
    assert at_2[0]["ratio"] == 1.5 and at_2[0]["taiji_jobs"] == 320
    # each (workload, load, policy, cost) simulated once: pcrr's runs are shared by both baselines
    assert sorted(simulated) == sorted(
        [
            ("pcrr", 160),
            ("tiresias", 160),
            ("optimus", 160),
            ("pcrr", 320),
            ("tiresias", 320),
            ("optimus", 320),
            ("pcrr", 80),
            ("tiresias", 80),
        ]
    )


def test_scheduler_loads_default_to_1_quick_and_to_the_issue_loads_in_full_mode():
    scheduler = load_benchmark("scheduler")
    assert scheduler.parse_args(["--quick"]).loads == [1.0]
    assert scheduler.parse_args([]).loads == [0.5, 1.0, 2.0]
    assert scheduler.parse_args(["--quick", "--loads", "2", "2.0"]).loads == [2.0]
    with pytest.raises(SystemExit):
        scheduler.parse_args(["--loads", "0"])


def test_adaptive_batch_workload_defaults_to_the_image_workload():
    adaptive_batch = load_benchmark("adaptive_batch")
    args = adaptive_batch.parse_args(["--quick"])
    assert (args.workload, args.large, args.lr, args.epochs, args.train_subset, args.test_subset) == (
        "fashion_mnist",
        1024,
        0.05,
        1,
        20000,
        0,
    )  # the whole 10k test set
    assert (args.large_warmup, args.warmup, args.interval, args.fixed_target) == (20, 100, 50, 0.85)
    runs = adaptive_batch.configs(args)
    assert sorted(runs) == ["adaptive", "goodput", "large_x0.25", "large_x0.5", "large_x1", "small"]
    half = runs["large_x0.5"]
    assert half[half.index("--lr") + 1] == "0.025" and half[half.index("--lr-ramp") + 1] == "20"
    seeds = [c[c.index("--seed") + 1] for c in (adaptive_batch.worker_common(args, rep) for rep in range(3))]
    assert seeds == ["0", "1", "2"], "each repetition trains with a seed of its own"


def test_adaptive_batch_anchors_on_the_strongest_large_run():
    adaptive_batch = load_benchmark("adaptive_batch")
    accuracy = adaptive_batch.WORKLOADS["fashion_mnist"]

    def run(to_target, final):
        return {"to_target_train_s": to_target, "final_accuracy": final}

    diverged = {
        "small": run(30.0, 0.86),
        "large_x1": run(None, 0.11),
        "large_x0.5": run(None, 0.52),
        "large_x0.25": run(None, 0.48),
    }
    assert adaptive_batch.strongest_large(diverged, accuracy) == "large_x0.5"  # the best final score
    diverged["large_x0.25"] = run(20.0, 0.85)
    diverged["large_x1"] = run(25.0, 0.86)
    assert adaptive_batch.strongest_large(diverged, accuracy) == "large_x0.25"  # reached the target first


def test_adaptive_batch_parses_the_shakespeare_workload():
    adaptive_batch = load_benchmark("adaptive_batch")
    quick = adaptive_batch.parse_args(["--workload", "shakespeare", "--quick"])
    assert (quick.workload, quick.small, quick.large, quick.lr, quick.large_warmup) == (
        "shakespeare",
        64,
        512,
        2e-3,
        20,
    )
    assert (quick.block, quick.d_model, quick.layers, quick.train_subset, quick.epochs) == (
        32,
        64,
        2,
        64000,
        1,
    )
    assert sorted(adaptive_batch.configs(quick)) == ["adaptive", "goodput", "large", "small"]  # one LR factor
    goodput = adaptive_batch.configs(quick)["goodput"]
    assert goodput[goodput.index("--adaptive") + 1] == "goodput"
    one_arm = adaptive_batch.parse_args(["--workload", "shakespeare", "--quick", "--arms", "goodput"])
    assert sorted(adaptive_batch.configs(one_arm)) == ["goodput", "large", "small"]
    common = adaptive_batch.worker_common(quick)
    assert "--test-subset" not in common and common[common.index("--block") + 1] == "32"
    full = adaptive_batch.parse_args(["--workload", "shakespeare", "--block", "48"])
    assert (full.block, full.d_model, full.epochs, full.validation_windows) == (48, 128, 2, 2048)
    assert common[common.index("--workload") + 1] == "shakespeare", "one worker script serves both workloads"


def fixed_and_adaptive_loss_runs(adaptive_to_target: float | None, adaptive_loss: float) -> dict:
    def run(to_target, train_s, loss):
        return {
            "to_target_train_s": to_target,
            "to_target_train_cpu_s": to_target,
            "train_s": train_s,
            "train_cpu_s": train_s,
            "final_loss": loss,
        }

    return {
        "runs": {
            "small": run(60.0, 100.0, 1.80),
            "large": run(None, 50.0, 2.10),
            "adaptive": run(adaptive_to_target, 70.0, adaptive_loss),
            "goodput": run(45.0, 65.0, 1.79),
        }
    }


def test_adaptive_batch_shakespeare_rows_score_validation_loss():
    adaptive_batch = load_benchmark("adaptive_batch")
    rows = {
        row["case"]: row
        for row in adaptive_batch.contract_rows([fixed_and_adaptive_loss_runs(55.0, 1.81)], "shakespeare")
    }
    assert "final test accuracy: adaptive vs small" not in rows
    against_large = rows["adaptive time to target vs large's whole training, wall s"]
    assert (against_large["taiji"], against_large["anchor"]) == (55.0, 50.0)
    assert against_large["ratio"] == pytest.approx(50 / 55, abs=1e-3) and against_large["target_met"] is True
    loss = rows["final validation loss: adaptive vs small"]
    assert (loss["taiji"], loss["anchor"], loss["loss_delta_nats"]) == (1.81, 1.80, 0.01)
    assert loss["target"] == "loss_delta_nats <= 0.02" and loss["target_met"] is True
    worse = adaptive_batch.contract_rows([fixed_and_adaptive_loss_runs(None, 1.85)], "shakespeare")
    assert worse[0]["taiji"] is None and worse[0]["target_met"] is False
    by_case = {row["case"]: row for row in worse}
    assert by_case["final validation loss: adaptive vs small"]["loss_delta_nats"] == 0.05
    assert by_case["final validation loss: adaptive vs small"]["target_met"] is False
    # every adaptive arm has its own rows, scored against the same fixed runs
    assert rows["goodput time to target vs large's whole training, wall s"]["ratio"] == pytest.approx(
        50 / 45, abs=1e-3
    )
    assert rows["final validation loss: goodput vs small"]["loss_delta_nats"] == -0.01
    assert (
        sum("goodput" in row["case"] for row in worse) == sum("adaptive" in row["case"] for row in worse) == 5
    )


def test_adaptive_batch_shakespeare_target_is_the_small_loss_plus_the_margin():
    adaptive_batch = load_benchmark("adaptive_batch")
    text = adaptive_batch.WORKLOADS["shakespeare"]
    assert text.target(1.8) == pytest.approx(1.82)
    evals = [
        {"train_s": 10.0, "train_cpu_s": 20.0, "loss": 1.9},
        {"train_s": 20.0, "train_cpu_s": 40.0, "loss": 1.82},
    ]
    assert adaptive_batch.time_to(evals, 1.82, "train_s", text) == 20.0
    assert adaptive_batch.time_to(evals, 1.7, "train_s", text) is None
    assert adaptive_batch.time_to(evals, None, "train_s", text) is None


def test_strategies_ratios_and_rows_with_the_straggler_setting_only():
    strategies = load_benchmark("strategies")
    rep = [
        {"strategy": name, "straggler": True, "samples_per_s": speed, "accuracy": acc}
        for name, speed, acc in (
            ("SyncSGD", 1000.0, 0.90),
            ("LocalSGD", 1600.0, 0.905),
            ("PairAveraging", 1500.0, 0.88),
        )
    ]
    ratios = strategies.ratios(rep)
    assert ratios == {
        "LocalSGD/SyncSGD samples/s, straggler": 1.6,
        "LocalSGD-SyncSGD accuracy points, straggler": 0.5,
        "PairAveraging/SyncSGD samples/s, straggler": 1.5,
        "PairAveraging-SyncSGD accuracy points, straggler": -2.0,
    }
    rows = {row["case"]: row for row in strategies.contract_rows([rep], ["sync", "pair", "local"])}
    assert set(rows) == {
        "pair_averaging_straggler",
        "pair_averaging_straggler_accuracy",
        "local_sgd_straggler",
        "local_sgd_straggler_accuracy",
    }
    assert rows["local_sgd_straggler"]["ratio"] == 1.6 and rows["local_sgd_straggler"]["target"] == ">= 1.5"


def test_sched_live_charges_each_launch_of_a_job_its_own_measured_costs(tmp_path):
    """A job launched, suspended, resumed twice: the replay gets one ResizeCost per launch, from its
    run log (launch -> first step) and the daemon's readings (first step seen, workers listed, each
    suspension's stall); a state without ``launches`` estimates a middle resume's launch."""
    from taiji.sched.costs import ResizeCost

    sched_live = load_benchmark("sched_live")
    run_dir = tmp_path / "state" / "jobs" / "s0001" / "run"
    run_dir.mkdir(parents=True)
    events = [
        {"time": t, "kind": kind}
        for t, kind in (
            (4.0, "start"),
            (10.0, "end"),
            (15.0, "start"),
            (20.0, "end"),
            (30.5, "start"),
            (40.0, "end"),
        )
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    job = {
        "id": "s0001",
        "started": 1.0,
        "resumed": 27.0,
        "ended": 41.5,
        "boots": [3.5, 3.0, 4.0],
        "costs": [5.0, 6.0],
        "stalls": [1.0, 2.0],
        "launches": [1.0, 12.5, 27.0],
        "allocations": [(3.0, 2), (11.0, 0), (14.5, 2), (21.0, 0), (29.0, 2), (41.5, 0)],
    }
    run = {"state": tmp_path / "state", "jobs": [job]}
    assert sched_live.launches(job) == [(1.0, 3.0), (12.5, 14.5), (27.0, 29.0)]
    old = {k: v for k, v in job.items() if k != "launches"}
    assert sched_live.launches(old) == [(1.0, 3.0), (12.5, 14.5), (27.0, 29.0)]  # 14.5 - the first's 2 s lag
    base = ResizeCost(start=9.0, grow=0.0, shrink=0.0, move=0.0, resume=7.0)
    costs = sched_live.job_costs(base, job, run)
    assert [c.start for c in costs] == [3.0] * 3 and [c.resume for c in costs] == [7.0, 2.5, 3.5]
    assert [c.seen for c in costs] == pytest.approx([0.5, 0.5, 0.5]) and [c.listed for c in costs] == [
        2.0
    ] * 3
    assert [c.stall for c in costs] == [1.0, 2.0, 1.5] and {c.exit for c in costs} == {1.5}
    assert {c.suspend for c in costs} == {5.5} and {c.boot for c in costs} == {3.5}


def test_sched_live_audits_the_slots_from_timelines_and_event_logs(tmp_path):
    sched_live = load_benchmark("sched_live")
    fine = {"a": [(0.0, 2), (5.0, 1), (9.0, 0)], "b": [(6.0, 1), (8.0, 0)]}
    assert sched_live.oversubscribed(fine, 2) == 0
    early = {"a": [(0.0, 2), (5.0, 1)], "b": [(4.0, 1)]}  # b's worker came before a's left
    assert sched_live.oversubscribed(early, 2) == 1
    run_dir = tmp_path / "state" / "jobs" / "s0001" / "run"
    run_dir.mkdir(parents=True)
    events = [
        {"time": 1.0, "kind": "start", "size": 2},
        {"time": 3.0, "kind": "policy"},
        {"time": 4.0, "kind": "resize", "size": 1},
        {"time": 7.0, "kind": "end", "size": 1},
    ]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = {"state": tmp_path / "state", "jobs": [{"id": "s0001", "started": 0.5, "ended": 7.5}]}
    assert sched_live.logged_oversubscribed(run, ["127.0.0.1"], 2) == 0
    assert sched_live.logged_oversubscribed(run, ["127.0.0.1"], 1) == 1, "2 workers on a 1-slot host at t=1"
    assert sched_live.fixed_overhead([run]) == {"launch_to_first_step_s": 0.5, "last_step_to_exit_s": 0.5}
    arrivals = sched_live.workload([10, 20, 30], 4.0, seed=3)
    assert [n for _, n, _ in arrivals] == [10, 20, 30] and arrivals[0][0] == 0.0
    assert arrivals == sched_live.workload([10, 20, 30], 4.0, seed=3), "seeded"
    saved = [
        {"id": "s0001", "state": "finished", "submitted": 100.0},
        {"id": "s0002", "state": "finished", "submitted": 104.0},
    ]
    (tmp_path / "state" / "state.json").write_text(json.dumps({"jobs": saved}))
    assert sched_live.saved_run(tmp_path, [(0.0, 10, True), (4.0, 20, False)])["t0"] == 100.0, "--reuse"
    with pytest.raises(RuntimeError, match="not a finished run"):
        sched_live.saved_run(tmp_path, [(0.0, 10, True)])


def test_scheduler_fidelity_rows_carry_the_per_job_agreement():
    scheduler = load_benchmark("scheduler")
    check = {
        "ours": 4100.0,
        "published": 4000.0,
        "deviation": 0.025,
        "mean_abs_log_ratio": 0.04,
        "within_25pct": 0.97,
        "p99_deviation": -0.01,
        "makespan_deviation": 0.035,
        "jobs": 160,
        "mode": "pollux",
        "per_workload": {6: {"mean_abs_log_ratio": 0.04}},
    }
    rows = scheduler.fidelity_rows({"tiresias": check, "pollux": dict(check, mode="taiji")}, [6])
    assert [row["case"] for row in rows] == [
        "fidelity vs Pollux's per-job JCTs: tiresias",
        "fidelity vs Pollux's per-job JCTs: pollux",
    ]
    tiresias, pollux = rows
    assert (tiresias["taiji"], tiresias["anchor"], tiresias["ratio"]) == (4100.0, 4000.0, 1.025)
    assert tiresias["mean_abs_log_ratio"] == 0.04 and tiresias["per_workload"] == {
        6: {"mean_abs_log_ratio": 0.04}
    }
    assert tiresias["target_met"] is False  # the makespan is 3.5% off
    assert "target" not in pollux


def test_integrations_rows_pair_each_side_with_the_anchor_of_its_repetition():
    integrations = load_benchmark("integrations")
    args = integrations.parse_args(["--quick"])
    assert (args.reps, args.steps, args.warmup) == (2, 60, 10)
    # steady state: steps 11..40 (the first 10 left out), 30 steps of the global batch
    times = [0.0] * 9 + [10.0 + 0.5 * i for i in range(31)]
    assert integrations.steady_rate(times, 10, 128) == pytest.approx(30 * 128 / 15.0)

    def side(rate):
        return {
            "samples_per_s": rate,
            "step_ms": 1e3 / rate,
            "wall_s": 30.0,
            "loss": 1.0,
            "cpu_ms_per_sample": 2.0,
        }

    runs = {
        "lightning": [
            {"taiji": side(100.0), "ddp": side(110.0)},
            {"taiji": side(60.0), "ddp": side(50.0)},
            {"taiji": side(95.0), "ddp": side(100.0)},
        ],
        "hf": [{"taiji": side(40.0), "ddp": side(40.0)}],
    }
    rows = {row["case"]: row for row in integrations.contract_rows(runs, args)}
    lightning = rows["Lightning: samples/s TaijiStrategy vs Lightning DDP"]
    # the ratio pairs runs of one repetition (drifting load hits both): median of 0.909, 1.2, 0.95
    assert (lightning["taiji"], lightning["anchor"], lightning["ratio"]) == (95.0, 100.0, 0.95)
    assert lightning["paired_ratios"] == [0.909, 1.2, 0.95] and lightning["target_met"] is False
    assert lightning["cpu_ratio"] == 1.0
    hf = rows["HF Trainer: samples/s TaijiTrainer vs Trainer DDP"]
    assert hf["ratio"] == 1.0 and hf["target_met"] is True and hf["global_batch"] == 32
