"""The Hugging Face Trainer on taiji: ``TaijiTrainer(model, TaijiTrainingArguments(...), train_dataset=...)``.

Importing this package imports transformers; without it installed it says which extra to install.
"""

from __future__ import annotations

try:
    import accelerate  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "taiji.integrations.transformers needs transformers and accelerate: pip install 'taiji[transformers]'"
    ) from exc

from .callback import TaijiCallback
from .trainer import TaijiTrainer, TaijiTrainingArguments

__all__ = ["TaijiCallback", "TaijiTrainer", "TaijiTrainingArguments"]
