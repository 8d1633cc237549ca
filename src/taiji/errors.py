"""taiji's error hierarchy. Every message says what happened, where, and what to do."""

from __future__ import annotations


class TaijiError(RuntimeError):
    """Base class of every error taiji raises on purpose."""


class ConfigError(TaijiError, ValueError):
    """Invalid configuration or argument supplied by the user."""


class LaunchError(TaijiError):
    """The launcher could not start or supervise the job."""


class StoreError(TaijiError):
    """The job's key-value store could not be reached or answered unexpectedly."""


class CommError(TaijiError):
    """A collective failed. Nothing of the step that issued it may be committed."""

    def __init__(self, message: str, *, channel: str = "", op: str = "", version: int = -1):
        super().__init__(message)
        self.channel = channel
        self.op = op
        self.version = version


class PeerLost(CommError):
    """A peer closed its connection or died during a collective."""


class CollectiveTimeout(CommError):
    """A collective did not complete within the timeout (a peer hangs or is gone)."""


class MismatchError(CommError):
    """Ranks called a collective with different shapes, dtypes or operations."""


class ConsensusError(CommError):
    """Ranks hold different values where they must agree."""


class AuthError(TaijiError):
    """A control record or a peer failed authentication (a wrong or missing job secret)."""


class CheckpointError(ConfigError):
    """A checkpoint cannot be used: missing, incomplete, damaged, of another model or format."""
