"""The strategies a Job can switch between, by name, built when first needed."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import ConfigError
from .base import Strategy


def _builtins() -> dict[str, Callable[[], Strategy]]:
    from .local_sgd import LocalSGD
    from .model_averaging import ModelAveraging
    from .sync_sgd import SyncSGD

    found: dict[str, Callable[[], Strategy]] = {
        "sync_sgd": SyncSGD,
        "model_averaging": ModelAveraging,
        "local_sgd": LocalSGD,
    }
    try:
        from .pair_averaging import PairAveraging

        found["pair_averaging"] = PairAveraging
    except ImportError:  # pragma: no cover - only while pair averaging is not built
        pass
    return found


class StrategyCatalog:
    """``initial`` is the strategy the Job starts with; ``extra`` adds named instances (which
    override the built-ins of the same name, e.g. ``{"model_averaging": ModelAveraging(0.5, 4)}``)."""

    def __init__(self, initial: Strategy | None, extra: Mapping[str, Strategy] | None):
        self._made: dict[str, Strategy] = {}
        self._factories = _builtins()
        for name, strategy in (extra or {}).items():
            if not isinstance(strategy, Strategy):
                raise ConfigError(f"strategies[{name!r}] must be a taiji Strategy, got {strategy!r}")
            self._made[name] = strategy
        if initial is None:
            self.initial = "sync_sgd"
        else:
            self.initial = initial.name
            self._made[self.initial] = initial

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(set(self._factories) | set(self._made)))

    def get(self, name: str) -> Strategy:
        if name not in self._made:
            if name not in self._factories:
                raise ConfigError(f"no strategy named {name!r}; the Job knows {', '.join(self.names)}")
            self._made[name] = self._factories[name]()
        return self._made[name]
