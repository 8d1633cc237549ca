"""Where code that was given no communicator finds one: the default Peer's, once registered.

The runtime registers its provider when ``taiji.init()`` runs (or on import of the peer module);
lower layers (strategies used on their own, the log prefix) ask here instead of importing the
runtime.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from .communicator import Communicator

_provider: Callable[[], Communicator] | None = None


def set_default_provider(provider: Callable[[], Communicator]) -> None:
    global _provider
    _provider = provider


def default_communicator() -> Communicator:
    if _provider is None:
        raise ConfigError("no communicator: call taiji.init() first, or pass one explicitly")
    return _provider()
