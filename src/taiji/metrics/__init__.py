"""Run records: rank 0's JSONL metric/event log (optionally TensorBoard) and timeline plots."""

from .plot import plot_run
from .runlog import EVENT_KINDS, RunLog, json_safe, read_jsonl

__all__ = ["EVENT_KINDS", "RunLog", "json_safe", "plot_run", "read_jsonl"]
