"""How a failed collective is told to the user: a timeout or a lost peer, and where it happened."""
from __future__ import annotations

from ..errors import CollectiveTimeout, CommError, PeerLost


def where(rank: int, version: int) -> str:
    return f"[rank {rank} v={version}]"


def failure_kind(exc: BaseException) -> type[CommError]:
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        return CollectiveTimeout
    return PeerLost


def collective_error(exc: BaseException, op: str, channel: str, *, rank: int, size: int, version: int,
                     timeout: float) -> CommError:
    """The CommError for ``exc``, raised by ``op`` on ``channel`` at ``rank`` of a cluster of ``size``."""
    kind = failure_kind(exc)
    if kind is CollectiveTimeout:
        what = (f"timed out after {timeout:g}s (cluster of {size}): {exc}. "
                "A peer hangs or is too slow; check the other workers' output.")
    else:  # say what happened, not the timeout that was never waited out
        what = (f"lost a peer (cluster of {size}): {exc}. A peer died or left; "
                "check the other workers' output.")
    return kind(f"{where(rank, version)} {op} on channel '{channel}' {what}", channel=channel, op=op, version=version)
