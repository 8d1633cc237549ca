"""PyTorch Lightning on taiji: ``L.Trainer(strategy=TaijiStrategy(policies=[...]))``.

Importing this package imports Lightning; without it installed it says which extra to install.
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "taiji.integrations.lightning needs PyTorch Lightning: pip install 'taiji[lightning]'"
    ) from exc

from .environment import TaijiEnvironment
from .strategy import TaijiStrategy

__all__ = ["TaijiEnvironment", "TaijiStrategy"]
