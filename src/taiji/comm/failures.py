"""How a failed collective is told to the user: a timeout or a lost peer (the survivors retry the
step in a new version), and where it happened; or a misuse that no retry can mend (NCCL's invalid
usage, most often two workers on one GPU): a ConfigError, which ends the worker with its message
instead of rebuilding the groups again and again."""

from __future__ import annotations

from ..errors import CollectiveTimeout, CommError, ConfigError, PeerLost, TaijiError


def where(rank: int, version: int) -> str:
    return f"[rank {rank} v={version}]"


def failure_kind(exc: BaseException) -> type[CommError]:
    text = str(exc).lower()
    if "timed out" in text or "timeout" in text:
        return CollectiveTimeout
    return PeerLost


def collective_error(
    exc: BaseException, op: str, channel: str, *, rank: int, size: int, version: int, timeout: float
) -> TaijiError:
    """The error for ``exc``, raised by ``op`` on ``channel`` at ``rank`` of a cluster of ``size``."""
    text = str(exc)
    if "invalid usage" in text.lower():  # ncclInvalidUsage: the same on every retry
        detail = next(
            (line.strip() for line in text.splitlines() if "Duplicate GPU" in line), text.splitlines()[0]
        )
        return ConfigError(
            f"{where(rank, version)} {op} on channel '{channel}': NCCL refused the group ({detail}). "
            "NCCL needs one GPU per worker: for several workers on one GPU run "
            "`taiji run --cuda-backend gloo`; else give each worker its own device "
            "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before building the model)."
        )
    kind = failure_kind(exc)
    if kind is CollectiveTimeout:
        what = (
            f"timed out after {timeout:g}s (cluster of {size}): {exc}. "
            "A peer hangs or is too slow; check the other workers' output."
        )
    else:  # say what happened, not the timeout that was never waited out
        what = (
            f"lost a peer (cluster of {size}): {exc}. A peer died or left; check the other workers' output."
        )
    return kind(
        f"{where(rank, version)} {op} on channel '{channel}' {what}", channel=channel, op=op, version=version
    )
