"""The report of ``benchmarks/elastic.py``: the rows of the result line (docs/design.md#performance-targets)
from every repetition's figures (medians; ratio = anchor seconds / taiji seconds, > 1: taiji recovers
sooner; for samples/s and shares taiji / anchor), a table of them for people, and the result
line itself. The rows against torchft name it in their case."""

from __future__ import annotations

from taiji_harness.bench import ahead_ratio, contract_row, print_result
from taiji_harness.elastic_analysis import BOOT_STAGES, each_over, median_over, rounded

CHANGES = (("grow 1->2", "grow"), ("grow 2->4", "grow"), ("shrink 4->2", "shrink"))
GROW_OVERHEAD_S, SHRINK_TARGET_S, CRASH_TARGET_S, HANG_OVER_TIMEOUT_S = 0.1, 0.020, 0.3, 0.3


def seconds_row(case: str, taiji: float | None, anchor: float | None, **details) -> dict:
    return contract_row(
        case,
        rounded(taiji),
        rounded(anchor),
        higher_is_better=False,
        ratio=ahead_ratio(taiji, anchor, higher_is_better=False),
        digits=2,
        **details,
    )


def met(taiji: float | None, target: float | None) -> bool | None:
    return None if taiji is None or target is None else taiji <= target


def resize_rows(
    taiji_runs: list[dict], anchor_runs: list[dict], model: dict, elastic: dict | None
) -> list[dict]:
    rows = []
    for i, (case, kind) in enumerate(CHANGES):

        def taiji(key: str, i: int = i) -> float | None:
            return median_over(taiji_runs, "changes", i, key)

        def anchor(key: str, i: int = i) -> float | None:
            return median_over(anchor_runs, "changes", i, key)

        broadcast = anchor("broadcast_s")
        if kind == "grow":
            target = None if broadcast is None else GROW_OVERHEAD_S + broadcast
            state_bytes = model.get("train_state_bytes")
            goal = {
                "target_s": rounded(target),
                "target": "<= 0.1 s + state transfer at broadcast bandwidth",
                "state_transfer_s": rounded(broadcast),
                "state_bytes": state_bytes,
                "broadcast_GBps": rounded((state_bytes or 0) / broadcast / 1e9, 3) if broadcast else None,
            }
        else:
            target = SHRINK_TARGET_S
            goal = {"target_s": target, "target": "<= 20 ms"}
        row = seconds_row(
            f"{case}: stall of running workers (s)",
            taiji("stall_s"),
            anchor("stall_s"),
            taiji_all=each_over(taiji_runs, "changes", i, "stall_s"),
            anchor_all=each_over(anchor_runs, "changes", i, "stall_s"),
            **goal,
            target_met=met(taiji("stall_s"), target),
            taiji_transition_total_s=rounded(taiji("transition_total_s")),
            taiji_transition_sync_s=rounded(taiji("transition_sync_s")),
            taiji_commit_to_next_step_s=rounded(taiji("to_loop_s")),
            taiji_first_step_extra_s=rounded(taiji("first_step_extra_s")),
            taiji_request_to_new_size_s=rounded(taiji("request_to_new_size_s"), 3),
            taiji_steps_while_joiners_booted=taiji("steps_while_joiners_booted"),
            taiji_step_ms_before_after=[
                rounded(taiji("step_ms_before"), 1),
                rounded(taiji("step_ms_after"), 1),
            ],
            anchor_kind=(
                "torchrun restart path: SIGTERM the job, start it at the new size from the checkpoint"
            ),
            anchor_request_to_first_step_s=rounded(anchor("request_to_first_step_s"), 3),
            anchor_without_agent_boot_s=rounded(anchor("without_agent_boot_s"), 3),
            ratio_without_agent_boot=rounded(
                ahead_ratio(taiji("stall_s"), anchor("without_agent_boot_s"), higher_is_better=False), 2
            ),
            anchor_parts_s={
                k: rounded(anchor(k), 3) for k in ("stop_s", "agent_boot_s", *BOOT_STAGES, "first_step_s")
            },
            anchor_step_ms_before_after=[
                rounded(anchor("step_ms_before"), 1),
                rounded(anchor("step_ms_after"), 1),
            ],
        )
        if i == 0:
            row["anchor_torchrun_elastic_scale_up"] = (elastic or {}).get(
                "outcome", "not tried (--elastic-wait 0)"
            )
        rows.append(row)
    return rows


def crash_row(taiji_runs: list[dict], anchor_runs: list[dict], one_of_three: list[dict]) -> dict:
    taiji = median_over(taiji_runs, "resume_s")
    row = seconds_row(
        "crash: SIGKILL 1 of 2 workers -> next committed step (s)",
        taiji,
        median_over(anchor_runs, "resume_s"),
        taiji_all=each_over(taiji_runs, "resume_s"),
        anchor_all=each_over(anchor_runs, "resume_s"),
        target_s=CRASH_TARGET_S,
        target="<= 0.3 s, at most one step redone",
        target_met=met(taiji, CRASH_TARGET_S),
        taiji_continues_with=median_over(taiji_runs, "to_size"),
        taiji_committed_steps_redone=median_over(taiji_runs, "committed_steps_redone"),
        taiji_inflight_step_retried=all(
            run["retried_step"] == run["last_committed_before"] + 1 for run in taiji_runs
        )
        if taiji_runs
        else None,
        taiji_step_ms=rounded(median_over(taiji_runs, "step_ms"), 1),
        anchor_kind="torchrun --max-restarts 1, checkpoint every step: both workers restart",
        anchor_committed_steps_redone=median_over(anchor_runs, "committed_steps_redone"),
        anchor_workers_restarted=median_over(anchor_runs, "workers_restarted"),
        anchor_parts_s={
            k: rounded(median_over(anchor_runs, k), 3)
            for k in ("kill_to_worker_exec_s", *BOOT_STAGES, "first_step_s")
        },
        anchor_step_ms=rounded(median_over(anchor_runs, "step_ms"), 1),
    )
    if one_of_three:
        row.update(
            taiji_1_of_3_s=rounded(median_over(one_of_three, "resume_s")),
            taiji_1_of_3_all_s=each_over(one_of_three, "resume_s"),
            taiji_1_of_3_continues_with=median_over(one_of_three, "to_size"),
        )
    return row


def hang_row(
    taiji_runs: list[dict], anchor_runs: list[dict], crash_anchor_runs: list[dict], hang_timeout: float
) -> dict:
    taiji = median_over(taiji_runs, "resume_s")
    target = hang_timeout + HANG_OVER_TIMEOUT_S
    if anchor_runs:
        anchor = median_over(anchor_runs, "resume_s")
        kind = (
            "torchrun --max-restarts 1, gloo timeout as taiji's; the agent SIGKILLs the stopped worker only "
            "after --shutdown-timeout (30 s)"
        )
    else:
        crash = median_over(crash_anchor_runs, "resume_s")
        anchor = None if crash is None else hang_timeout + crash
        kind = (
            "lower bound, not run: collective timeout + torchrun's measured crash restart (a real run also "
            "waits --shutdown-timeout, 30 s by default, before it SIGKILLs the stopped worker)"
        )
    return seconds_row(
        f"hang: SIGSTOP 1 of 2 workers, collective timeout {hang_timeout:g} s -> next committed step (s)",
        taiji,
        anchor,
        taiji_all=each_over(taiji_runs, "resume_s"),
        anchor_all=each_over(anchor_runs, "resume_s"),
        target_s=target,
        target="<= collective timeout + 0.3 s",
        target_met=met(taiji, target),
        taiji_over_timeout_s=rounded(None if taiji is None else taiji - hang_timeout),
        anchor_kind=kind,
    )


def torchft_rows(
    taiji_runs: list[dict],
    torchft_runs: list[dict],
    ddp_runs: list[dict],
    torchrun: dict,
    torchft_missing: str | None,
) -> list[dict]:
    """taiji beside torchft in one kill-and-join run each (and DDP's steady state). Each row names
    what torchft could not complete, with its error, and carries torchrun's figure of the same
    case (``torchrun_s``) where the benchmark measures one."""
    errors = [run["error"] for run in torchft_runs if "error" in run]
    version = next((run["version"] for run in torchft_runs if run.get("version")), None)

    def status(*phases: str) -> dict:
        failed = [e for e in errors if e["phase"] in ("start", *phases)]
        if torchft_missing:
            return {"anchor_error": torchft_missing}
        if failed:
            return {"anchor_error": failed[0], "anchor_failed_runs": f"{len(failed)} of {len(torchft_runs)}"}
        return {}

    def both(*path) -> tuple:
        return median_over(taiji_runs, *path), median_over(torchft_runs, *path)

    config = (
        "torchft: lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 (its README); "
        "2 replica groups of 1 worker, each under torchrun; Manager(min_replica_size=1, PGTransport), "
        "ProcessGroupGloo(5 s), its DistributedDataParallel, Optimizer and DistributedSampler (train_ddp.py)"
    )
    kill, anchor_kill = both("kill", "resume_s")
    stall, anchor_stall = both("join", "stall_s")
    first, anchor_first = both("join", "joiner_first_step_s")
    share, anchor_share = both("exactly_once", "exactly_once_share")
    rate, anchor_rate = both("samples_per_s")
    ddp_rate = median_over(ddp_runs, "samples_per_s")
    grow = [run["changes"][0] for run in torchrun.get("resize", []) if run.get("changes")]
    common = {"anchor_version": version, "anchor_config": config}
    return [
        seconds_row(
            "kill: SIGKILL 1 of 2 workers (replica groups) -> survivors' next committed step (s) vs torchft",
            kill,
            anchor_kill,
            taiji_all=each_over(taiji_runs, "kill", "resume_s"),
            anchor_all=each_over(torchft_runs, "kill", "resume_s"),
            taiji_committed_steps_redone=median_over(taiji_runs, "kill", "committed_steps_redone"),
            anchor_committed_steps_redone=median_over(torchft_runs, "kill", "committed_steps_redone"),
            taiji_attempts_discarded=median_over(taiji_runs, "kill", "attempts_discarded"),
            anchor_attempts_discarded=median_over(torchft_runs, "kill", "attempts_discarded"),
            torchrun_s=rounded(median_over(torchrun.get("crash", []), "resume_s")),
            **status("kill"),
            **common,
        ),
        seconds_row(
            "join: a worker (replica group) joins 1 survivor -> survivors' stall (s) vs torchft",
            stall,
            anchor_stall,
            taiji_all=each_over(taiji_runs, "join", "stall_s"),
            anchor_all=each_over(torchft_runs, "join", "stall_s"),
            taiji_steps_while_joiner_booted=median_over(taiji_runs, "join", "steps_while_joiner_booted"),
            anchor_steps_while_joiner_booted=median_over(torchft_runs, "join", "steps_while_joiner_booted"),
            torchrun_s=rounded(median_over(grow, "stall_s")),
            **status("kill", "join"),
        ),
        seconds_row(
            "join: request -> joiner's first committed step (s) vs torchft",
            first,
            anchor_first,
            taiji_all=each_over(taiji_runs, "join", "joiner_first_step_s"),
            anchor_all=each_over(torchft_runs, "join", "joiner_first_step_s"),
            taiji_boot_to_first_step_s=rounded(
                median_over(taiji_runs, "join", "joiner_boot_to_first_step_s")
            ),
            anchor_boot_to_first_step_s=rounded(
                median_over(torchft_runs, "join", "joiner_boot_to_first_step_s")
            ),
            torchrun_s=rounded(median_over(grow, "request_to_first_step_s")),
            **status("kill", "join"),
        ),
        contract_row(
            "exactly-once across the kill and the join: share of drawn samples trained on exactly once "
            "vs torchft",
            rounded(share),
            rounded(anchor_share),
            higher_is_better=True,
            taiji_all=each_over(taiji_runs, "exactly_once", "exactly_once_share"),
            anchor_all=each_over(torchft_runs, "exactly_once", "exactly_once_share"),
            **{
                f"{side}_{key}": median_over(runs, "exactly_once", key)
                for side, runs in (("taiji", taiji_runs), ("anchor", torchft_runs))
                for key in ("samples_lost", "samples_repeated", "samples_committed")
            },
            **status("kill", "join"),
        ),
        contract_row(
            "steady state, 2 workers: samples/s, Job loop vs torchft's DistributedDataParallel",
            rounded(rate, 1),
            rounded(anchor_rate, 1),
            higher_is_better=True,
            taiji_all=each_over(taiji_runs, "samples_per_s", digits=1),
            anchor_all=each_over(torchft_runs, "samples_per_s", digits=1),
            **status(),
        ),
        contract_row(
            "steady state, 2 workers: samples/s, Job loop vs DDP",
            rounded(rate, 1),
            rounded(ddp_rate, 1),
            higher_is_better=True,
            anchor_all=each_over(ddp_runs, "samples_per_s", digits=1),
            anchor_kind="torchrun, plain DDP on gloo, no checkpoint",
        ),
    ]


def build_rows(
    results: dict[str, list[dict]],
    elastic: dict | None,
    model: dict,
    hang_timeout: float,
    torchft_missing: str | None = None,
) -> list[dict]:
    """The result rows from each measurement's repetitions (``results[name]``)."""
    torchrun = {"crash": results["torchrun_crash"], "resize": results["torchrun_resize"]}
    return [
        *resize_rows(results["taiji_resize"], results["torchrun_resize"], model, elastic),
        crash_row(results["taiji_crash"], results["torchrun_crash"], results["taiji_crash3"]),
        hang_row(results["taiji_hang"], results["torchrun_hang"], results["torchrun_crash"], hang_timeout),
        *torchft_rows(
            results["taiji_kill_join"],
            results["torchft_kill_join"],
            results["torchrun_steady"],
            torchrun,
            torchft_missing,
        ),
    ]


def table(rows: list[dict]) -> str:
    """The rows for people: case, taiji, anchor ("failed" where it could not complete the case),
    ratio, whether taiji met its target."""

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:g}" if isinstance(value, (int, float)) else str(value)

    width = max(len(row["case"]) for row in rows)
    lines = [f"{'case':{width}}  {'taiji':>8}  {'anchor':>8}  {'ratio':>7}  target met"]
    for row in rows:
        anchor = "failed" if row.get("anchor_error") else cell(row["anchor"])
        lines.append(
            f"{row['case']:{width}}  {cell(row['taiji']):>8}  {anchor:>8}  {cell(row['ratio']):>7}  "
            f"{cell(row.get('target_met'))}"
        )
    return "\n".join(lines)


def report(rows: list[dict], **extra) -> None:
    """The table, then the result line (the last line on stdout)."""
    print(table(rows), flush=True)
    print_result("elastic", rows, **extra)
