"""The learning-rate schedule of a training run: a factor of the base lr per step.

* ``constant``: 1; ``poly``: ``(1 - step / steps) ** power`` (Caffe's "poly" policy, the TernGrad
  paper's LeNet setting); ``cosine``: half a cosine from 1 down to ``COSINE_FLOOR`` over the
  steps after the warm-up (Loshchilov & Hutter's SGDR without restarts, as GPT models train)::

      cos(step) = f + (1 - f) * (1 + cos(pi * (step - W) / (steps - W))) / 2   for step >= W;

* times a linear **warm-up** over the first ``W`` steps, from lr/10 to lr (the optimal-quantization
  paper, Sec. 4: "a linear warm-up schedule starting from base learning rate/10 for 5 epochs",
  used with clipping for ORQ and BinGrad)::

      warm(step) = 0.1 + 0.9 * step / W   for step < W,   1 after

  (during the warm-up ``cosine`` is 1).

``W`` is ``warmup_steps``, or ``warmup_epochs`` times the steps of one epoch (the training set
once over all workers: ``ceil(train examples / (workers * batch per worker))``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("constant", "poly", "cosine")
#: the warm-up's first factor: base lr / 10
WARMUP_START = 0.1
#: where ``cosine`` ends: base lr / 10
COSINE_FLOOR = 0.1


def steps_per_epoch(train_examples: int, workers: int, worker_batch: int) -> int:
    """Steps that show every training example once: ``ceil(n / (workers * batch))``."""
    return max(1, math.ceil(train_examples / (workers * worker_batch)))


def warmup_length(warmup_steps: int, warmup_epochs: float, epoch_steps: int) -> int:
    """``W``: ``warmup_steps``, or ``round(warmup_epochs * epoch_steps)`` (0: no warm-up)."""
    return warmup_steps or round(warmup_epochs * epoch_steps)


def lr_factor(schedule: str, steps: int, power: float, warmup: int) -> Callable[[int], float]:
    """The factor of the base lr at each step (0-based), as ``LambdaLR`` takes it."""

    def factor(step: int) -> float:
        if schedule == "poly":
            base = max(0.0, 1 - step / steps) ** power
        elif schedule == "cosine" and step >= warmup:
            done = min(1.0, (step - warmup) / max(1, steps - warmup))
            base = COSINE_FLOOR + (1 - COSINE_FLOOR) * (1 + math.cos(math.pi * done)) / 2
        else:
            base = 1.0
        warm = WARMUP_START + (1 - WARMUP_START) * step / warmup if step < warmup else 1.0
        return base * warm

    return factor
