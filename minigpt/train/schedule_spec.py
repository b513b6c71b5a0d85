"""The LR schedule as specified, from params alone: the independent reference that preflight's lr_schedule check
holds the run's schedule to at every step, and that the lr_applied watchdog holds every applied LR to.

Written apart from train_step.cosine_with_warmup on purpose (a check that asks the code under test for its own
expected value proves nothing): linear warmup from 0 to train.lr over train.warmup_steps, then half a cosine
from train.lr down to train.min_lr (10% of train.lr when null), along whichever is further, the steps
(train.max_steps) or the clock (train.max_seconds); at min_lr from the end on.
"""

from __future__ import annotations

import math


def specified_lr(train_cfg, step: int, clock_fraction: float = 0.0) -> float:
    peak = float(train_cfg.lr)
    floor = peak / 10 if train_cfg.min_lr is None else float(train_cfg.min_lr)
    warmup, total = int(train_cfg.warmup_steps), int(train_cfg.max_steps)
    if step < warmup:
        return peak * (step / warmup)
    decay_steps = total - warmup if total > warmup else 1
    done = min(1.0, max((step - warmup) / decay_steps, clock_fraction))
    return floor + (peak - floor) * (math.cos(math.pi * done) + 1.0) / 2.0
