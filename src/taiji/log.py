"""Rank-aware log prefix ``[rank r v=version step=s]``. Nothing is configured on import."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

_prefix_source: Callable[[], str] = lambda: "[taiji]"  # noqa: E731


def set_prefix_source(source: Callable[[], str]) -> None:
    """The runtime says where the prefix comes from (the default peer's rank, version, step)."""
    global _prefix_source
    _prefix_source = source


class RankPrefixFilter(logging.Filter):
    """Adds ``record.taiji`` = ``[rank r v=version step=s]`` from the default peer."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.taiji = _prefix_source()
        return True


def configure_logging(level: str | int = "INFO", stream=None) -> logging.Handler:
    """For applications (examples, scripts): send log records to ``stream`` with the rank prefix.

    Libraries must not call this; taiji itself never does on import.
    """
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.addFilter(RankPrefixFilter())
    handler.setFormatter(logging.Formatter("%(taiji)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if any(isinstance(f, RankPrefixFilter) for f in h.filters)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return handler
