"""The report of ``benchmarks/elastic.py``: the rows of DESIGN §9's result line from every
repetition's figures (medians; ratio = anchor seconds / taiji seconds, > 1: taiji recovers
sooner), a table of them for people, and the result line itself."""
from __future__ import annotations

from _common import ahead_ratio, contract_row, print_result
from _elastic_analysis import BOOT_STAGES, each_over, median_over, rounded

CHANGES = (("grow 1->2", "grow"), ("grow 2->4", "grow"), ("shrink 4->2", "shrink"))
GROW_OVERHEAD_S, SHRINK_TARGET_S, CRASH_TARGET_S, HANG_OVER_TIMEOUT_S = 0.1, 0.020, 0.3, 0.3


def seconds_row(case: str, taiji: float | None, anchor: float | None, **details) -> dict:
    return contract_row(case, rounded(taiji), rounded(anchor), higher_is_better=False,
                        ratio=ahead_ratio(taiji, anchor, higher_is_better=False), digits=2, **details)


def met(taiji: float | None, target: float | None) -> bool | None:
    return None if taiji is None or target is None else taiji <= target


def resize_rows(taiji_runs: list[dict], anchor_runs: list[dict], model: dict, elastic: dict | None) -> list[dict]:
    rows = []
    for i, (case, kind) in enumerate(CHANGES):
        def taiji(key: str) -> float | None:
            return median_over(taiji_runs, "changes", i, key)

        def anchor(key: str) -> float | None:
            return median_over(anchor_runs, "changes", i, key)
        broadcast = anchor("broadcast_s")
        if kind == "grow":
            target = None if broadcast is None else GROW_OVERHEAD_S + broadcast
            state_bytes = model.get("train_state_bytes")
            goal = {"target_s": rounded(target), "target": "<= 0.1 s + state transfer at broadcast bandwidth",
                    "state_transfer_s": rounded(broadcast), "state_bytes": state_bytes,
                    "broadcast_GBps": rounded((state_bytes or 0) / broadcast / 1e9, 3) if broadcast else None}
        else:
            target = SHRINK_TARGET_S
            goal = {"target_s": target, "target": "<= 20 ms"}
        row = seconds_row(
            f"{case}: stall of running workers (s)", taiji("stall_s"), anchor("stall_s"),
            taiji_all=each_over(taiji_runs, "changes", i, "stall_s"),
            anchor_all=each_over(anchor_runs, "changes", i, "stall_s"),
            **goal, target_met=met(taiji("stall_s"), target),
            taiji_transition_total_s=rounded(taiji("transition_total_s")),
            taiji_transition_sync_s=rounded(taiji("transition_sync_s")),
            taiji_commit_to_next_step_s=rounded(taiji("to_loop_s")),
            taiji_first_step_extra_s=rounded(taiji("first_step_extra_s")),
            taiji_request_to_new_size_s=rounded(taiji("request_to_new_size_s"), 3),
            taiji_steps_while_joiners_booted=taiji("steps_while_joiners_booted"),
            taiji_step_ms_before_after=[rounded(taiji("step_ms_before"), 1), rounded(taiji("step_ms_after"), 1)],
            anchor_kind="torchrun restart path: SIGTERM the job, start it at the new size from the checkpoint",
            anchor_request_to_first_step_s=rounded(anchor("request_to_first_step_s"), 3),
            anchor_without_agent_boot_s=rounded(anchor("without_agent_boot_s"), 3),
            ratio_without_agent_boot=rounded(ahead_ratio(taiji("stall_s"), anchor("without_agent_boot_s"),
                                                         higher_is_better=False), 2),
            anchor_parts_s={k: rounded(anchor(k), 3) for k in
                            ("stop_s", "agent_boot_s", *BOOT_STAGES, "first_step_s")},
            anchor_step_ms_before_after=[rounded(anchor("step_ms_before"), 1), rounded(anchor("step_ms_after"), 1)])
        if i == 0:
            row["anchor_torchrun_elastic_scale_up"] = (elastic or {}).get("outcome", "not tried (--elastic-wait 0)")
        rows.append(row)
    return rows


def crash_row(taiji_runs: list[dict], anchor_runs: list[dict], one_of_three: list[dict]) -> dict:
    taiji = median_over(taiji_runs, "resume_s")
    row = seconds_row(
        "crash: SIGKILL 1 of 2 workers -> next committed step (s)", taiji, median_over(anchor_runs, "resume_s"),
        taiji_all=each_over(taiji_runs, "resume_s"), anchor_all=each_over(anchor_runs, "resume_s"),
        target_s=CRASH_TARGET_S, target="<= 0.3 s, at most one step redone", target_met=met(taiji, CRASH_TARGET_S),
        taiji_continues_with=median_over(taiji_runs, "to_size"),
        taiji_committed_steps_redone=median_over(taiji_runs, "committed_steps_redone"),
        taiji_inflight_step_retried=all(run["retried_step"] == run["last_committed_before"] + 1
                                        for run in taiji_runs) if taiji_runs else None,
        taiji_step_ms=rounded(median_over(taiji_runs, "step_ms"), 1),
        anchor_kind="torchrun --max-restarts 1, checkpoint every step: both workers restart",
        anchor_committed_steps_redone=median_over(anchor_runs, "committed_steps_redone"),
        anchor_workers_restarted=median_over(anchor_runs, "workers_restarted"),
        anchor_parts_s={k: rounded(median_over(anchor_runs, k), 3) for k in
                        ("kill_to_worker_exec_s", *BOOT_STAGES, "first_step_s")},
        anchor_step_ms=rounded(median_over(anchor_runs, "step_ms"), 1))
    if one_of_three:
        row.update(taiji_1_of_3_s=rounded(median_over(one_of_three, "resume_s")),
                   taiji_1_of_3_all_s=each_over(one_of_three, "resume_s"),
                   taiji_1_of_3_continues_with=median_over(one_of_three, "to_size"))
    return row


def hang_row(taiji_runs: list[dict], anchor_runs: list[dict], crash_anchor_runs: list[dict],
             hang_timeout: float) -> dict:
    taiji = median_over(taiji_runs, "resume_s")
    target = hang_timeout + HANG_OVER_TIMEOUT_S
    if anchor_runs:
        anchor = median_over(anchor_runs, "resume_s")
        kind = ("torchrun --max-restarts 1, gloo timeout as taiji's; the agent SIGKILLs the stopped worker only "
                "after --shutdown-timeout (30 s)")
    else:
        crash = median_over(crash_anchor_runs, "resume_s")
        anchor = None if crash is None else hang_timeout + crash
        kind = ("lower bound, not run: collective timeout + torchrun's measured crash restart (a real run also "
                "waits --shutdown-timeout, 30 s by default, before it SIGKILLs the stopped worker)")
    return seconds_row(
        f"hang: SIGSTOP 1 of 2 workers, collective timeout {hang_timeout:g} s -> next committed step (s)",
        taiji, anchor, taiji_all=each_over(taiji_runs, "resume_s"), anchor_all=each_over(anchor_runs, "resume_s"),
        target_s=target, target="<= collective timeout + 0.3 s", target_met=met(taiji, target),
        taiji_over_timeout_s=rounded(None if taiji is None else taiji - hang_timeout), anchor_kind=kind)


def build_rows(results: dict[str, list[dict]], elastic: dict | None, model: dict, hang_timeout: float) -> list[dict]:
    """The result rows from each measurement's repetitions (``results[name]``)."""
    return [*resize_rows(results["taiji_resize"], results["torchrun_resize"], model, elastic),
            crash_row(results["taiji_crash"], results["torchrun_crash"], results["taiji_crash3"]),
            hang_row(results["taiji_hang"], results["torchrun_hang"], results["torchrun_crash"], hang_timeout)]


def table(rows: list[dict]) -> str:
    """The rows for people: case, taiji, anchor, ratio, whether taiji met its target."""
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:g}" if isinstance(value, (int, float)) else str(value)
    width = max(len(row["case"]) for row in rows)
    lines = [f"{'case':{width}}  {'taiji':>8}  {'anchor':>8}  {'ratio':>7}  target met"]
    lines += [f"{row['case']:{width}}  {cell(row['taiji']):>8}  {cell(row['anchor']):>8}  {cell(row['ratio']):>7}  "
              f"{cell(row.get('target_met'))}" for row in rows]
    return "\n".join(lines)


def report(rows: list[dict], **extra) -> None:
    """The table, then the result line (the last line on stdout)."""
    print(table(rows), flush=True)
    print_result("elastic", rows, **extra)
