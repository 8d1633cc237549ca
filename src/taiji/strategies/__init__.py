"""How replicas agree: synchronisation strategies."""

from .base import Strategy
from .sync_sgd import SyncSGD

__all__ = ["Strategy", "SyncSGD"]
