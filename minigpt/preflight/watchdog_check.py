"""Preflight's self-test of the training loop's watchdogs: a watchdog that cannot fire watches nothing. Each one is
driven, with this run's `watch.*` thresholds, through a short stream of step and evaluation readings made to break
exactly its rule, and must fire under its own name; a healthy stream must fire none. A watchdog whose threshold
is set at its limit (a share of 1) cannot fire by configuration: it is recorded as off, not failed."""

from __future__ import annotations

from typing import Callable

import torch

from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train.watchdogs import LEVELS, Watchdogs, WatchdogStop

REFERENCE_RATE, LR, LOSS = 1000.0, 1e-3, 3.0
HEALTHY_SAMPLE = "pack my box with five dozen liquor jugs"  # no 4-gram in it repeats, no placeholder


class _Optimizer:
    """The one attribute the watchdogs read: the LR each group applied."""

    def __init__(self, *lrs: float):
        self.param_groups = [{"lr": lr} for lr in lrs]


class _Feed:
    """Readings into a fresh set of watchdogs; the names that fired (stops included)."""

    def __init__(self, watch, grad_clip: float, placeholder: str):
        self.dogs = Watchdogs(watch, grad_clip, placeholder, reference_tokens_per_s=REFERENCE_RATE,
                              say=lambda _m: None)
        self.watch, self.grad_clip, self.placeholder = watch, grad_clip, placeholder
        self.model = torch.nn.Linear(2, 1)
        self.model(torch.ones(1, 2)).sum().backward()
        self.fired: list[str] = []
        self.step_no = 0

    def _record(self, call: Callable[[], list[dict]]) -> None:
        try:
            self.fired += [event["name"] for event in call()]
        except WatchdogStop as stop:
            self.fired.append(stop.event["name"])

    def steps(self, count: int, *, applied: float = LR, norm: float | None = None, loss: float = LOSS,
              rate: float = REFERENCE_RATE) -> None:
        norm = self.grad_clip / 2 if norm is None else norm
        for _ in range(count):
            self.step_no += 1
            self._record(lambda: self.dogs.after_step(self.step_no, LR, _Optimizer(applied, applied), self.model,
                                                      norm, loss, rate))

    def evaluation(self, val_loss: float, sample: str | None = HEALTHY_SAMPLE) -> None:
        self._record(lambda: self.dogs.after_eval(self.step_no, val_loss, sample))


def _healthy(feed: _Feed) -> None:
    """Every rule kept: the specified LR, unclipped live gradients, steady speed, val improving, varied samples."""
    w = feed.watch
    for k in range(w.first_evals + w.rising_evals + 2):
        feed.steps(max(1, (w.settle_steps + 2 * w.window) // (w.first_evals + w.rising_evals + 2) + 1),
                   loss=LOSS - 0.1 * k)
        feed.evaluation(LOSS - (2 * w.val_margin + 0.1) * (k + 1))


# each watchdog: a stream that breaks its rule alone, or None when its thresholds make it unable to fire
BREAKS: dict[str, Callable[[_Feed], None] | None] = {
    "lr_applied": lambda f: f.steps(1, applied=LR * (1 + 2 * f.watch.lr_rtol) + 1e-6),
    "gradient_flow": lambda f: f.steps(f.watch.dead_grad_steps, norm=0.0),
    "val_improving": lambda f: [f.evaluation(LOSS) for _ in range(f.watch.first_evals)],
    "train_diverging": lambda f: [(f.steps(1, loss=LOSS + k * (f.watch.rise_tolerance + 1)), f.evaluation(LOSS - k))
                                  for k in range(f.watch.rising_evals + 1)],
    "clipping_share": lambda f: f.steps(f.watch.settle_steps + 2 * f.watch.window, norm=2 * f.grad_clip + 1),
    "throughput": lambda f: f.steps(f.watch.window, rate=REFERENCE_RATE * f.watch.throughput_fraction / 2),
    "sample_probe": lambda f: [f.evaluation(LOSS - k, "abcd" * 50 if f.watch.max_repeat_share < 1
                                            else f.placeholder * 200) for k in range(f.watch.first_evals)],
}
assert set(BREAKS) == set(LEVELS), "every watchdog needs a stream that breaks its rule"


def off_by_configuration(watch) -> list[str]:
    """Watchdogs no reading can fire: a share threshold at 1 (no share exceeds it)."""
    off = []
    if watch.clip_share_max >= 1:
        off.append("clipping_share")
    if watch.max_repeat_share >= 1 and watch.max_placeholder_share >= 1:
        off.append("sample_probe")
    return off


def check_watchdogs_fire(ctx: Context) -> dict:
    watch, grad_clip, placeholder = ctx.params.watch, ctx.params.train.grad_clip, ctx.params.clean.placeholder
    healthy = _Feed(watch, grad_clip, placeholder)
    _healthy(healthy)
    off = off_by_configuration(watch)
    judged = {name: tally.evaluated for name, tally in healthy.dogs.tallies.items()}
    measured: dict = {"judged_on_healthy": judged, "fired_on_healthy": sorted(set(healthy.fired)),
                      "off_by_configuration": off, "fired": {}}
    silent = []
    for name, breaks in BREAKS.items():
        if name in off:
            continue
        feed = _Feed(watch, grad_clip, placeholder)
        breaks(feed)
        measured["fired"][name] = sorted(set(feed.fired))
        if name not in feed.fired:
            silent.append(name)
    problems = []
    if silent:
        problems.append(f"{', '.join(silent)} did not fire on readings that break "
                        f"{'its' if len(silent) == 1 else 'their'} rule")
    unjudged = [name for name, count in judged.items() if not count]
    if unjudged:  # silence on readings never judged proves nothing
        problems.append(f"{', '.join(unjudged)} never judged the healthy readings")
    if healthy.fired:
        problems.append(f"{', '.join(sorted(set(healthy.fired)))} fired on healthy readings")
    if problems:
        raise CheckFailed("; ".join(problems) + ": a watchdog that cannot fire, or fires on a healthy run, watches "
                          "nothing (see minigpt/train/watchdogs.py and watch.* in params.yaml)", measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("watchdogs_fire", check_watchdogs_fire, (),
          "with this run's watch.* thresholds, each watchdog fires by name on readings that break its rule alone, "
          "and none fires on healthy readings (a share threshold of 1 turns a watchdog off: recorded, not failed)",
          ("a watchdog's comparison inverted or its condition unreachable", "watch.* thresholds that no reading can "
           "cross", "a watchdog that fires on every run (its warnings would be noise)")),
)
