"""What a failed collective means, said so that the reader knows what to do: a peer lost (the
survivors retry the step in a new version), a timeout (a peer hangs), or a misuse that no retry
can mend (NCCL's invalid usage, most often two workers on one GPU): a ConfigError, which ends the
worker with its message instead of rebuilding the groups again and again."""
from __future__ import annotations

from ..errors import CollectiveTimeout, ConfigError, PeerLost, TaijiError


def collective_error(exc: BaseException, *, where: str, op: str, channel: str, size: int, timeout: float,
                     version: int) -> TaijiError:
    """The error to raise for ``exc``, raised by ``op`` on ``channel`` of a cluster of ``size``."""
    text = str(exc)
    lowered = text.lower()
    if "invalid usage" in lowered:  # ncclInvalidUsage: the same on every retry
        detail = next((line.strip() for line in text.splitlines() if "Duplicate GPU" in line), text.splitlines()[0])
        return ConfigError(
            f"{where} {op} on channel '{channel}': NCCL refused the group ({detail}). NCCL needs one GPU per "
            "worker: for several workers on one GPU run `taiji run --cuda-backend gloo`; else give each worker "
            "its own device (torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before building the model).")
    if "timed out" in lowered or "timeout" in lowered:
        return CollectiveTimeout(f"{where} {op} on channel '{channel}' timed out after {timeout:g}s (cluster of "
                                 f"{size}): {exc}. A peer hangs or is too slow; check the other workers' output.",
                                 channel=channel, op=op, version=version)
    # say what happened, not the timeout that was never waited out
    return PeerLost(f"{where} {op} on channel '{channel}' lost a peer (cluster of {size}): {exc}. A peer died "
                    "or left; check the other workers' output.", channel=channel, op=op, version=version)
