"""Preflight's checks of the training step's contracts, each pure and fast (no training):

- decay_split: the run's optimizer groups as the guide's exercise states them: every matrix (linear and embedding
  weights) decays at train.weight_decay, every bias and LayerNorm parameter does not, every trainable parameter is
  in exactly one group, and no frozen one is in any; under train.optimizer=muon, Muon's groups hold exactly the
  blocks' linear weights (never an embedding, the head, a gain or a bias), and under adamw there is no Muon group;
- lr_schedule: the run's whole LR schedule, evaluated at every step of warmup and of its first DENSE_STEPS, then at
  SAMPLED_STEPS evenly spaced steps to the last (at every step when that finds a problem), and under
  train.max_seconds over the share of the clock spent, against its specification: warmup from ~0 to the peak at
  warmup_steps, never above the peak, never below min_lr after warmup, non-increasing after warmup, ending at min_lr;
- clipping_contract: the real training step reports the global norm of the model's gradients before clipping,
  and after its clipping that norm is at most the clip threshold (checked at the run's grad_clip and at one that
  must cut).
- weight_average (train.ema_decay set): the run's moving average holds tensors of its own, leaves the trained
  weights untouched, and after each of its first updates equals its specification computed independently in float64
  (average = d_n * average + (1 - d_n) * trained, d_n = min(decay, n / (n + 9))).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn as nn

from minigpt.model import batch_loss
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train import optim, schedule_spec, train_step, weight_average

# time fractions and steps at which a clock-limited run's schedule is evaluated
TIME_GRID = 101
STEPS_ON_THE_CLOCK = 64
# steps at which the schedule by steps is evaluated: every one of the first DENSE_STEPS (and of warmup), then
# SAMPLED_STEPS evenly spaced to the last
DENSE_STEPS = 4096
SAMPLED_STEPS = 8192
LR_RTOL = 1e-9
NORM_RTOL = 1e-3
AVERAGE_UPDATES = 12  # past the first nine, where n / (n + 9) is below any useful decay
AVERAGE_ATOL = 1e-5


def _expected_decay(model: nn.Module) -> dict[str, bool]:
    """name -> whether the exercise says it decays: matrices (linear and embedding weights) yes; biases and every
    parameter of a LayerNorm no, whatever its shape (LayerNorm is judged by the module that owns the parameter)."""
    expected = {}
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            expected[full] = not (isinstance(module, nn.LayerNorm) or name.endswith("bias")) and param.dim() >= 2
    return expected


def _expected_muon(model: nn.Module) -> set[str]:
    """What Muon must train: the weights of the linear layers inside the blocks (not the embeddings or head)."""
    return {f"{module_name}.weight" for module_name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module_name.startswith("blocks.") and module.weight.requires_grad}


def _muon_problems(optimizer, names: dict[int, str], model: nn.Module, kind: str) -> tuple[list[str], list[str]]:
    in_muon = sorted(names[id(p)] for g in optimizer.param_groups if optim.is_muon_group(g)
                     for p in g["params"] if id(p) in names)
    if kind != "muon":
        return in_muon, ([f"train.optimizer is {kind} but Muon trains {', '.join(in_muon)}"] if in_muon else [])
    expected = _expected_muon(model)
    problems = []
    outside = sorted(expected - set(in_muon))
    strays = sorted(set(in_muon) - expected)
    if outside:
        problems.append(f"hidden matrices not trained by Muon: {', '.join(outside)}")
    if strays:
        problems.append(f"trained by Muon but not a hidden matrix (embeddings, head, gains and biases belong to "
                        f"AdamW): {', '.join(strays)}")
    return in_muon, problems


def check_decay_split(ctx: Context) -> dict:
    model, train = ctx.model, ctx.params.train
    optimizer = train_step.make_optimizer(model, train)  # building it changes nothing in the model
    names = {id(p): n for n, p in model.named_parameters()}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    placed: dict[str, list[float]] = {}
    strangers = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in names:
                strangers += 1
                continue
            placed.setdefault(names[id(param)], []).append(group["weight_decay"])
    expected = _expected_decay(model)
    problems = []
    twice = sorted(n for n, decays in placed.items() if len(decays) > 1)
    missing = sorted(n for n in expected if n not in placed and n not in frozen)
    frozen_in = sorted(n for n in placed if n in frozen)
    wrong_decay = sorted(n for n, decays in placed.items() if expected.get(n) and decays[0] != train.weight_decay)
    wrongly_decayed = sorted(n for n, decays in placed.items() if expected.get(n) is False and decays[0] != 0.0)
    measured = {"groups": [{"weight_decay": g["weight_decay"],
                            "parameters": len(g["params"])} for g in optimizer.param_groups],
                "decayed": sorted(n for n, d in placed.items() if d[0] != 0.0),
                "not_decayed": sorted(n for n, d in placed.items() if d[0] == 0.0),
                "weight_decay": train.weight_decay, "optimizer": train.optimizer}
    measured["muon"], muon_problems = _muon_problems(optimizer, names, model, train.optimizer)
    problems.extend(muon_problems)
    if twice:
        problems.append(f"in more than one group: {', '.join(twice)}")
    if missing:
        problems.append(f"trainable but in no group (never updated): {', '.join(missing)}")
    if frozen_in:
        problems.append(f"frozen (requires_grad=False) but in a group: {', '.join(frozen_in)}")
    if strangers:
        problems.append(f"{strangers} tensor(s) in the optimizer that are not parameters of the model")
    if wrong_decay:
        problems.append(f"matrices not decayed at weight_decay {train.weight_decay:g}: {', '.join(wrong_decay)}")
    if wrongly_decayed:
        problems.append(f"biases / LayerNorm parameters decayed: {', '.join(wrongly_decayed)}")
    if problems:
        raise CheckFailed("the optimizer's weight-decay split is wrong: " + "; ".join(problems), measured)
    return measured


def evaluated_steps(max_steps: int, warmup: int) -> np.ndarray:
    """The steps lr_schedule evaluates first: every step up to max(warmup + 1, DENSE_STEPS), then SAMPLED_STEPS evenly
    spaced to the last (a budget preset's max_steps is a million: evaluating each would cost seconds)."""
    dense = np.arange(1, min(max_steps, max(warmup + 1, DENSE_STEPS)) + 1)
    spread = np.linspace(dense[-1], max_steps, SAMPLED_STEPS).astype(np.int64)
    return np.unique(np.concatenate([dense, spread, [max_steps // 2 or 1, max(max_steps - 1, 1), max_steps]]))


def _schedule_problems(steps: np.ndarray, lrs: np.ndarray, peak: float, floor: float, warmup: int) -> list[str]:
    """lrs[i] is the LR of step steps[i]; steps ascend from 1 to max_steps with every step up to warmup included."""
    problems = []
    tol = LR_RTOL * peak
    if np.any(lrs > peak + tol):
        i = int(np.argmax(lrs > peak + tol))
        problems.append(f"by steps: above the peak {peak:g} at step {steps[i]} ({lrs[i]:.6g})")
    if warmup > 0:
        ramp = lrs[:warmup]
        if lrs[0] > 2.0 * peak / warmup + tol:
            problems.append(f"by steps: warmup starts at {lrs[0]:.6g}, not near 0 "
                            f"(expected <= {2 * peak / warmup:.3g})")
        if np.any(np.diff(ramp) < -tol):
            problems.append(f"by steps: falls during warmup (step {int(np.argmax(np.diff(ramp) < -tol)) + 2})")
        if abs(lrs[warmup - 1] - peak) > 0.02 * peak + peak / max(warmup, 1):
            problems.append(f"by steps: reaches {lrs[warmup - 1]:.6g} at the end of warmup (step {warmup}), not the "
                            f"peak {peak:g}")
    first = max(warmup, 1) - 1
    after, after_steps = lrs[first:], steps[first:]
    if np.any(after < floor - tol):
        i = int(np.argmax(after < floor - tol))
        problems.append(f"by steps: below min_lr {floor:g} at step {after_steps[i]} ({after[i]:.6g})")
    rises = np.diff(after) > tol
    if np.any(rises):
        i = int(np.argmax(rises)) + 1
        problems.append(f"by steps: rises after warmup at step {after_steps[i]} ({after[i - 1]:.6g} at step "
                        f"{after_steps[i - 1]} -> {after[i]:.6g})")
    if abs(lrs[-1] - floor) > tol + 1e-6 * peak:
        problems.append(f"by steps: ends at {lrs[-1]:.6g}, not at min_lr {floor:g}")
    return problems


def _problems_by_steps(train, steps: np.ndarray, peak: float, floor: float) -> tuple[np.ndarray, list[str]]:
    lrs = np.array([train_step.scheduled_lr(train, int(s)) for s in steps])
    problems = _schedule_problems(steps, lrs, peak, floor, train.warmup_steps)
    # the specification written from params alone (what the lr_applied watchdog holds every applied LR to)
    specified = schedule_spec.specified_lrs(train, steps)
    apart = np.flatnonzero(np.abs(lrs - specified) > LR_RTOL * peak)
    if apart.size:
        i = int(apart[0])
        problems.append(f"differs from its specification (minigpt/train/schedule_spec.py) at {apart.size} of "
                        f"{steps.size} steps evaluated, first step {steps[i]}: {lrs[i]:.6g} against {specified[i]:.6g}")
    return lrs, problems


def check_lr_schedule(ctx: Context) -> dict:
    train = ctx.params.train
    peak = train.lr
    floor = 0.1 * peak if train.min_lr is None else train.min_lr
    steps = evaluated_steps(train.max_steps, train.warmup_steps)
    lrs, problems = _problems_by_steps(train, steps, peak, floor)
    if problems and steps.size < train.max_steps:
        # a schedule that fails is evaluated at every step, so the message names the first bad step exactly
        steps = np.arange(1, train.max_steps + 1)
        lrs, problems = _problems_by_steps(train, steps, peak, floor)
    lr_of = dict(zip(steps.tolist(), lrs.tolist()))
    measured = {"steps": train.max_steps, "steps_evaluated": int(steps.size), "warmup_steps": train.warmup_steps,
                "peak": peak, "min_lr": floor,
                "lr_at": {str(s): float(f"{lr_of[s]:.6g}") for s in
                          sorted({1, max(train.warmup_steps, 1), train.max_steps // 2 or 1, train.max_steps})}}
    if train.max_seconds is not None:
        # a clock-limited run: at any step past warmup, the LR as the clock runs out must fall to min_lr
        fractions = np.linspace(0.0, 1.0, TIME_GRID)
        after = np.unique(np.linspace(max(train.warmup_steps, 1), train.max_steps, STEPS_ON_THE_CLOCK).astype(int))
        for step in after:
            by_time = np.array([train_step.scheduled_lr(train, int(step), float(f)) for f in fractions])
            spec = schedule_spec.specified_lrs(train, np.full(fractions.shape, step), fractions)
            if np.any(np.abs(by_time - spec) > LR_RTOL * peak):
                problems.append(f"on the clock at step {int(step)}: differs from its specification "
                                "(minigpt/train/schedule_spec.py)")
                break
            if np.any(np.diff(by_time) > LR_RTOL * peak) or np.any(by_time > peak * (1 + LR_RTOL)) \
                    or np.any(by_time < floor - LR_RTOL * peak) or abs(by_time[-1] - floor) > 1e-6 * peak:
                problems.append(f"on the clock at step {int(step)}: LRs {by_time.min():.6g} .. {by_time.max():.6g}, "
                                f"{'not non-increasing' if np.any(np.diff(by_time) > LR_RTOL * peak) else 'in range'} "
                                f"as the budget runs out, ending at {by_time[-1]:.6g} (min_lr {floor:g})")
                break
        measured.update(max_seconds=train.max_seconds, time_fractions=TIME_GRID, steps_on_the_clock=len(after))
    if problems:
        raise CheckFailed("the LR schedule breaks its specification: " + "; ".join(problems[:4]), measured)
    return measured


def _global_norm(params) -> float:
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))


def _one_step(ctx: Context, grad_clip: float) -> dict:
    """The real step on a copy of the model, against a reference backward of the same batch and dropout masks."""
    train = ctx.params.train
    reference = copy.deepcopy(ctx.model)
    reference.train()
    reference.zero_grad(set_to_none=True)
    ctx.seed_all(8)
    batch_loss.calc_loss_batch(reference, *ctx.batch, train.precision).backward()
    expected = _global_norm(reference.parameters())
    model = copy.deepcopy(ctx.model)
    model.train()
    optimizer = train_step.make_optimizer(model, train)
    seen = {}

    def before_the_update(*_):  # the gradients as the optimizer steps on them: after the step's clipping
        seen.setdefault("clipped", _global_norm(model.parameters()))

    optimizer.register_step_pre_hook(before_the_update)
    ctx.seed_all(8)
    result = train_step.training_step(model, optimizer, *ctx.batch, train.lr, train.precision, grad_clip)
    return {"grad_clip": grad_clip, "reference_norm": expected, "reported_norm": result.grad_norm,
            "norm_at_step": seen.get("clipped"), "stepped": result.stepped}


def check_clipping_contract(ctx: Context) -> dict:
    train = ctx.params.train
    at_run = _one_step(ctx, train.grad_clip)
    # a threshold the gradients surely exceed, so the clipping must act
    cutting = _one_step(ctx, min(train.grad_clip, at_run["reference_norm"] / 2))
    measured = {"at_grad_clip": at_run, "cutting": cutting}
    problems = []
    for case in (at_run, cutting):
        ref, clip = case["reference_norm"], case["grad_clip"]
        if not case["stepped"] or case["norm_at_step"] is None:
            problems.append(f"the step did not step at grad_clip {clip:.4g} (loss or norm non-finite)")
            continue
        if abs(case["reported_norm"] - ref) > NORM_RTOL * ref:
            problems.append(f"the reported norm {case['reported_norm']:.6g} is not the global gradient norm before "
                            f"clipping {ref:.6g} (grad_clip {clip:.4g})")
        if case["norm_at_step"] > clip * (1 + NORM_RTOL):
            problems.append(f"after clipping at {clip:.4g} the optimizer stepped on a gradient of norm "
                            f"{case['norm_at_step']:.6g}")
        if ref > clip and case["norm_at_step"] < clip * (1 - NORM_RTOL):
            problems.append(f"clipping at {clip:.4g} shrank a norm of {ref:.6g} to {case['norm_at_step']:.6g}, "
                            "below the threshold")
    if problems:
        raise CheckFailed("the training step breaks the clipping contract: " + "; ".join(problems), measured)
    return measured


def check_weight_average(ctx: Context) -> dict:
    decay = ctx.params.train.ema_decay
    if decay is None:
        return {"ema_decay": None, "note": "train.ema_decay is null: the run evaluates and keeps its trained weights"}
    trained = copy.deepcopy(ctx.model)
    average = weight_average.WeightAverage(trained, decay)
    mine, theirs = weight_average.floating_tensors(average.model), weight_average.floating_tensors(trained)
    problems = []
    if set(mine) != set(theirs):
        problems.append(f"the average's tensors are not the model's: {sorted(set(mine) ^ set(theirs))[:6]}")
    shared = sorted(n for n in set(mine) & set(theirs) if mine[n].data_ptr() == theirs[n].data_ptr())
    if shared:
        problems.append(f"the average shares storage with the trained weights: {', '.join(shared[:6])}")
    expected = {n: t.detach().double().clone() for n, t in theirs.items()}
    gen = ctx.generator(9)
    worst = 0.0
    with torch.no_grad():
        for n in range(1, AVERAGE_UPDATES + 1):
            for name, tensor in theirs.items():  # the trained weights move, as a step would move them
                tensor.add_(torch.randn(tensor.shape, generator=gen).to(tensor) * 0.1)
            before = {name: t.detach().clone() for name, t in theirs.items()}
            average.update(trained)
            kept = min(decay, n / (n + 9))
            for name, tensor in theirs.items():
                expected[name] = kept * expected[name] + (1 - kept) * before[name].double()
                if not torch.equal(tensor, before[name]):
                    problems.append(f"update {n} changed the trained weight {name}")
                if name in mine:
                    worst = max(worst, float((mine[name].double() - expected[name]).abs().max()))
    if worst > AVERAGE_ATOL:
        problems.append(f"after {AVERAGE_UPDATES} updates the average is {worst:.3g} from its specification "
                        f"(tolerance {AVERAGE_ATOL:g})")
    measured = {"ema_decay": decay, "updates": AVERAGE_UPDATES, "max_abs_difference": worst,
                "tensors": len(mine)}
    if problems:
        raise CheckFailed("the moving average of the weights breaks its specification: " + "; ".join(problems[:4]),
                          measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("decay_split", check_decay_split, ("gradients",),
          lambda c: (f"every linear/embedding matrix in a group with weight_decay {c.params.train.weight_decay:g}, "
                     "every bias and LayerNorm parameter in one with 0; each trainable parameter in exactly one "
                     "group, no frozen one in any" + ("; Muon trains exactly the blocks' linear weights"
                                            if c.params.train.optimizer == "muon" else "")),
          ("build_param_groups splitting by name or shape the wrong way (LayerNorm weights, biases decayed)",
           "a parameter added to the model but not to the optimizer",
           "the optimizer built over another model's parameters",
           "Muon handed an embedding or the head (2-D, but not a hidden matrix)")),
    Check("lr_schedule", check_lr_schedule, (),
          lambda c: (f"all {c.params.train.max_steps} steps{' and the clock' if c.params.train.max_seconds else ''}: "
                     f"warmup from ~0 to lr {c.params.train.lr:g} at step {c.params.train.warmup_steps}, never above "
                     "it, never below min_lr after warmup, non-increasing after warmup, ending at min_lr"),
          ("a broken cosine_with_warmup (progress past 1, wrong sign, min_lr ignored)",
           "warmup computed off by one or never ending", "the time budget's fraction not driving the decay")),
    Check("clipping_contract", check_clipping_contract, ("gradients",),
          lambda c: (f"the step's reported norm = the global gradient norm before clipping (rtol {NORM_RTOL}); after "
                     f"clipping at grad_clip {c.params.train.grad_clip:g} (and at a threshold that must cut) the "
                     "norm the optimizer steps on is at most the threshold"),
          ("clip_grad_norm_ over a subset of the parameters (another model, a filtered list)",
           "the norm measured after clipping instead of before", "clipping per parameter instead of globally")),
    Check("weight_average", check_weight_average, ("forward_shapes",),
          lambda c: ("train.ema_decay null: nothing to check" if c.params.train.ema_decay is None else
                     f"the average at decay {c.params.train.ema_decay:g} owns its tensors, leaves the trained weights "
                     f"as they are, and after each of {AVERAGE_UPDATES} updates is within {AVERAGE_ATOL:g} of "
                     "d_n * average + (1 - d_n) * trained, d_n = min(decay, n / (n + 9))"),
          ("the average built on the trained model itself (no copy: it is just the trained weights)",
           "the lerp weighted the wrong way (decay on the new weights)",
           "a buffer or parameter left out of the average")),
)
