"""The LR schedule as specified, from params alone: the independent reference that preflight's lr_schedule check
holds the run's schedule to at every step, and that the lr_applied watchdog holds every applied LR to.

Written apart from train_step.cosine_with_warmup on purpose (a check that asks the code under test for its own
expected value proves nothing), in numpy over whole arrays of steps: linear warmup from 0 to train.lr over
train.warmup_steps, then half a cosine from train.lr down to train.min_lr (10% of train.lr when null), along
whichever is further, the steps (train.max_steps) or the clock (train.max_seconds); at min_lr from the end on.
"""

from __future__ import annotations

import numpy as np


def specified_lrs(train_cfg, steps, clock_fraction: float | np.ndarray = 0.0) -> np.ndarray:
    """The specified LR at each of `steps` (1-based), with `clock_fraction` of the time budget spent (one for all
    steps, or one per step)."""
    steps = np.asarray(steps, dtype=np.float64)
    peak = float(train_cfg.lr)
    floor = peak / 10 if train_cfg.min_lr is None else float(train_cfg.min_lr)
    warmup, total = int(train_cfg.warmup_steps), int(train_cfg.max_steps)
    decay_steps = total - warmup if total > warmup else 1
    done = np.clip(np.maximum((steps - warmup) / decay_steps, clock_fraction), None, 1.0)
    decayed = floor + (peak - floor) * (np.cos(np.pi * done) + 1.0) / 2.0
    return np.where(steps < warmup, peak * steps / max(warmup, 1), decayed)


def specified_lr(train_cfg, step: int, clock_fraction: float = 0.0) -> float:
    return float(specified_lrs(train_cfg, [step], clock_fraction)[0])
