"""The one-worker gradient noise scale: back-propagate the batch as two halves.

With one worker there is no second batch size to compare, so the batch's per-sample losses are
back-propagated in two halves: the mean squared norm of the halves' gradients (batch b/2) and the
full gradient (batch b) feed the same two-batch estimator as a multi-worker step. The summed
gradient equals one backward of the mean loss. The halves' norms are exact; the full gradient's is
measured by the strategy, sampled in a large bucket (``monitor.norms``): its chunks move from step
to step, so that adds noise to the estimate, not a bias, and a step that does not split (a scalar
loss) pays no full pass over the bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch


def split_backward(
    losses: torch.Tensor,
    params: Sequence[torch.nn.Parameter],
    no_sync: Callable[[], AbstractContextManager[None]],
) -> float:
    """Backward ``losses.mean()`` as two halves; return the mean |g|² of the two half-batch
    gradients. ``no_sync`` keeps the strategy from synchronising after the first half."""
    n, half = len(losses), len(losses) // 2
    with no_sync():
        (losses[:half].sum() / n).backward(retain_graph=True)
    first = [p.grad.detach().clone() if p.grad is not None else None for p in params]
    (losses[half:].sum() / n).backward()
    sq_a = sq_b = 0.0
    for p, g_a in zip(params, first):
        if p.grad is None or g_a is None:
            continue
        sq_a += float((g_a * (n / half)).square().sum())
        sq_b += float(((p.grad - g_a) * (n / (n - half))).square().sum())
    return (sq_a + sq_b) / 2
