"""Watchdogs: named checks that keep running after preflight, at every step or every evaluation of the loop.

A stop ends the run with one line (like the NaN guard's) and leaves the last checkpoint written before it; a
warning never stops a run: it is printed once, recorded on the step it fired in the run log, counted in
train_summary.json and shown on the run and comparison pages. Thresholds are `watch.*` in params.yaml
(docs/preflight.md, "Watchdogs", says how each was calibrated and what to do when it fires).

- lr_applied (every step, stop): an optimizer group applied another LR than the schedule's specification gives
  (minigpt/train/schedule_spec.py, from params alone: never the step's own value)
- gradient_flow (every step, stop): the gradient norm is exactly 0, or a trainable parameter got no gradient,
  `dead_grad_steps` steps running
- val_improving (each eval, warning): from the `first_evals`-th eval on, val loss is not `val_margin` below the first
  eval's (under model.ngram_expert, below the n-gram alone's on the same batches: the mixture starts near it)
- train_diverging (each eval, stop): the mean train loss since the previous eval rose by > `rise_tolerance`,
  `rising_evals` evals running
- clipping_share (every `window` steps, warning): more than `clip_share_max` of the window's steps were clipped
  (windows that start after `settle_steps`: a fresh model's first gradients are large by nature)
- throughput (every `window` steps, warning): the window's median tokens/s < `throughput_fraction` x the reference
  (`make machine`'s figure for this run's step, else the run's first window)
- sample_probe (each eval, warning): the sample's repeated 4-gram share > `max_repeat_share` (from the `first_evals`-th
  eval on) or its placeholder share > `max_placeholder_share`
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from minigpt.core.errors import MinigptError
from minigpt.data.textstats import repeated_ngram_share

STOP, WARNING = "stop", "warning"
LEVELS = {"lr_applied": STOP, "gradient_flow": STOP, "val_improving": WARNING, "train_diverging": STOP,
          "clipping_share": WARNING, "throughput": WARNING, "sample_probe": WARNING}


class WatchdogStop(MinigptError):
    """A watchdog stopped the run; the last checkpoint written before it is intact."""

    def __init__(self, message: str, event: dict):
        super().__init__(message)
        self.event = event


@dataclass
class Tally:
    evaluated: int = 0
    fired: int = 0
    first_step: int | None = None
    first_message: str = ""


@dataclass
class Watchdogs:
    """The loop calls after_step at every step and after_eval at every evaluation; each returns the events of
    that step (dicts for the run log). `reference_tokens_per_s`: `make machine`'s figure for this run's step, if any."""
    cfg: object  # params.watch
    grad_clip: float
    placeholder: str
    reference_tokens_per_s: float | None = None
    say: object = print
    ngram_val_loss: float | None = None  # model.ngram_expert: the n-gram alone's loss on the loop's val batches
    tallies: dict[str, Tally] = field(default_factory=lambda: {name: Tally() for name in LEVELS})
    _dead_steps: int = 0
    _window: list[tuple[float, float]] = field(default_factory=list)  # (tokens/s, grad norm) since the window began
    _window_start: int = 0
    _trainable: list | None = None
    _train_losses: list[float] = field(default_factory=list)  # since the previous eval
    _eval_means: list[float] = field(default_factory=list)
    _rising: int = 0
    _first_val: float | None = None
    _evals: int = 0
    _reference_source: str = "`make machine` figure"

    def __post_init__(self):
        if self.reference_tokens_per_s is None:
            self._reference_source = "run's first window"

    # ------------------------------------------------------------------------------------------ every step
    def after_step(self, step: int, lr: float, optimizer, model, grad_norm: float, loss: float,
                   tokens_per_s: float) -> list[dict]:
        events = []
        applied = [group["lr"] for group in optimizer.param_groups]
        self._count("lr_applied")
        # written as "not within", so that a NaN on either side is a mismatch too
        off = [i for i, value in enumerate(applied) if not abs(value - lr) <= self.cfg.lr_rtol * max(abs(lr), 1e-12)]
        if off:
            self._stop(step, "lr_applied",
                       f"at step {step} optimizer group {off[0]} applied lr {applied[off[0]]:.6g} but the specified "
                       f"schedule says {lr:.6g} (groups: {', '.join(f'{v:.6g}' for v in applied)}): the step "
                       "computes another schedule than train.* specify, or something else writes "
                       "param_groups[...]['lr']")
        self._count("gradient_flow")
        if self._trainable is None:  # listed once: walking the modules every step would cost more than the checks
            self._trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        missing = [name for name, p in self._trainable if p.grad is None]
        dead = grad_norm == 0.0 or bool(missing)
        self._dead_steps = self._dead_steps + 1 if dead else 0
        if self._dead_steps >= self.cfg.dead_grad_steps:
            what = (f"no gradient for {', '.join(missing[:6])}{' …' if len(missing) > 6 else ''}" if missing
                    else "the gradient norm is exactly 0")
            self._stop(step, "gradient_flow",
                       f"{what} for {self._dead_steps} steps in a row (steps {step - self._dead_steps + 1}..{step}): "
                       "gradients stopped flowing (a detach / no_grad in the forward, a loss multiplied by 0, frozen "
                       "parameters)")
        self._train_losses.append(loss)
        if not self._window:
            self._window_start = step
        self._window.append((tokens_per_s, grad_norm))
        if len(self._window) >= self.cfg.window:
            events += self._window_checks(step, lr)
            self._window = []
        return events

    def _window_checks(self, step: int, lr: float) -> list[dict]:
        events = []
        rates = [rate for rate, _ in self._window]
        norms = [norm for _, norm in self._window]
        share = sum(norm > self.grad_clip for norm in norms) / len(norms)
        if self._window_start > self.cfg.settle_steps:
            self._count("clipping_share")
        if self._window_start > self.cfg.settle_steps and share > self.cfg.clip_share_max:
            events.append(self._warn(step, "clipping_share",
                                     f"{share:.0%} of the last {len(norms)} steps were clipped at grad_clip "
                                     f"{self.grad_clip:g} (median gradient norm {statistics.median(norms):.3g}, lr "
                                     f"{lr:.3g}): clipping on almost every step is a symptom; a lower LR, a longer "
                                     "warmup, or a look at what makes the gradients large"))
        median = statistics.median(rates)
        if self.reference_tokens_per_s is None:  # no measured figure: the run's first window is the reference
            self.reference_tokens_per_s = median
            return events
        self._count("throughput")
        if median < self.cfg.throughput_fraction * self.reference_tokens_per_s:
            events.append(self._warn(step, "throughput",
                                     f"median {median:,.0f} tokens/s over the last {len(rates)} steps, below "
                                     f"{self.cfg.throughput_fraction:g} x the {self._reference_source}, "
                                     f"{self.reference_tokens_per_s:,.0f}: likely other processes on the cores (a "
                                     "second run, a build), memory pressure (swap), or thermal throttling"))
        return events

    # ------------------------------------------------------------------------------------------ each eval
    def after_eval(self, step: int, val_loss: float, sample: str | None) -> list[dict]:
        events = []
        self._evals += 1
        if self._first_val is None:
            self._first_val = val_loss
        elif self._evals >= self.cfg.first_evals:
            self._count("val_improving")
            expert = self.ngram_val_loss is not None
            reference = self.ngram_val_loss if expert else self._first_val
            if not val_loss < reference - self.cfg.val_margin:
                what = "the n-gram alone's" if expert else "the first eval's"
                events.append(self._warn(step, "val_improving",
                                         f"after {self._evals} evals the val loss is {val_loss:.4f}, not "
                                         f"{self.cfg.val_margin:g} below {what} {reference:.4f}: the run has stopped "
                                         "learning (LR too low or decayed too early, or it overfits)"
                                         + ("; the network adds nothing to the n-gram" if expert else "")))
        if self._train_losses:
            mean = sum(self._train_losses) / len(self._train_losses)
            self._train_losses = []
            if self._eval_means:
                self._count("train_diverging")
                self._rising = self._rising + 1 if mean > self._eval_means[-1] + self.cfg.rise_tolerance else 0
            self._eval_means.append(mean)
            if self._rising >= self.cfg.rising_evals:
                history = ", ".join(f"{m:.4f}" for m in self._eval_means[-self.cfg.rising_evals - 1:])
                self._stop(step, "train_diverging",
                           f"the mean train loss rose at {self._rising} evals in a row ({history} nats): the run "
                           "diverges (LR too high for this stage of training, a schedule that rises, bad data)")
        if sample:
            events += self._sample_checks(step, sample)
        return events

    def _sample_checks(self, step: int, sample: str) -> list[dict]:
        self._count("sample_probe")
        repeated = repeated_ngram_share(sample, 4)
        placeholders = sample.count(self.placeholder) / len(sample)
        problems = []
        if self._evals >= self.cfg.first_evals and repeated > self.cfg.max_repeat_share:
            problems.append(f"{repeated:.0%} of its 4-grams repeat (above {self.cfg.max_repeat_share:.0%}: a loop)")
        if placeholders > self.cfg.max_placeholder_share:
            problems.append(f"{placeholders:.1%} of it is the placeholder {self.placeholder!r} (above "
                            f"{self.cfg.max_placeholder_share:.1%}: the model learned the rare-character token)")
        if not problems:
            return []
        return [self._warn(step, "sample_probe", "the sample got worse: " + "; ".join(problems))]

    # ------------------------------------------------------------------------------------------ bookkeeping
    def _count(self, name: str) -> None:
        self.tallies[name].evaluated += 1

    def _fire(self, step: int, name: str, message: str) -> dict:
        tally = self.tallies[name]
        tally.fired += 1
        if tally.first_step is None:
            tally.first_step, tally.first_message = step, message
        return {"name": name, "level": LEVELS[name], "message": message}

    def _warn(self, step: int, name: str, message: str) -> dict:
        event = self._fire(step, name, message)
        if self.tallies[name].fired == 1:  # once on the console; every firing is in the log and the summary
            self.say(f"[train] watchdog warning ({name}) at step {step}: {message}")
        return event

    def _stop(self, step: int, name: str, message: str) -> None:
        event = self._fire(step, name, message)
        raise WatchdogStop(f"watchdog {name} stopped the run at step {step}: {message}", event)

    def summary(self) -> dict:
        return {"warnings": sum(t.fired for n, t in self.tallies.items() if LEVELS[n] == WARNING),
                "reference_tokens_per_s": self.reference_tokens_per_s, "reference": self._reference_source,
                "checks": {name: {"level": LEVELS[name], "evaluated": t.evaluated, "fired": t.fired,
                                  "first_step": t.first_step, "first_message": t.first_message}
                           for name, t in self.tallies.items()}}
