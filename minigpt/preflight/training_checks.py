"""Preflight's rehearsal of the training run, through the run's own step (minigpt.train.train_step): its optimizer,
its LR schedule (warmup shortened to at most preflight.rehearsal_warmup_max steps), its precision, its
clipping, on real train batches of preflight.batch_size windows (with their soft targets when train.distill_alpha > 0,
drawn by minigpt.train.distill.draw_batch as the loop draws them).

Three checks read it:
- lr_stability: the rehearsal stays finite, applies the configured peak LR, and does not diverge;
- rehearsal_learns: after it, the loss on fixed train batches is clearly below what train's character
  frequencies alone score on them (a correctly updating model is well below by then; docs/preflight.md, "The
  rehearsal");
- single_batch_overfit: a fresh debug model memorises one batch through the same step.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import torch

from minigpt.data import batching
from minigpt.data.bpe import BPETokenizer
from minigpt.model import batch_loss
from minigpt.model.gpt import MiniGPTConfig
from minigpt.model.nonfinite import first_non_finite_module
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train import distill, train_step

# a rise must last this many steps (the running median's window is 2 * SUSTAIN - 1) to count as divergence:
# one odd batch (a table of numbers, a run of rare characters) lifts a single step's loss by nats
SUSTAIN = 3


def unigram_log_probs(ids: torch.Tensor, vocab_size: int) -> np.ndarray:
    """log p(character) from train's frequencies (unseen characters get one count, so every value is finite)."""
    counts = np.bincount(ids.numpy(), minlength=vocab_size).astype(np.float64)
    counts = np.maximum(counts, 1.0)
    return np.log(counts / counts.sum())


def unigram_entropy(log_p: np.ndarray) -> float:
    """Entropy (nats/char) of train's character frequencies: the loss of the best model that ignores context."""
    return float(-(np.exp(log_p) * log_p).sum())


def unigram_loss(batches, log_p: np.ndarray) -> float:
    """The loss a model that knows only train's character frequencies gets on these batches' targets."""
    targets = np.concatenate([y.cpu().numpy().ravel() for _, y, *_prior in batches])
    return float(-log_p[targets].mean())


def rehearsal_warmup(ctx: Context) -> int:
    return min(ctx.params.train.warmup_steps, ctx.params.preflight.rehearsal_warmup_max)


def running_median(values: list[float], window: int) -> list[float]:
    half = window // 2
    return [statistics.median(values[max(0, i - half): i + half + 1]) for i in range(len(values))]


def rehearse(ctx: Context) -> dict:
    """Run the rehearsal once; its record goes to ctx.rehearsal for the checks that judge it."""
    train, pre = ctx.params.train, ctx.params.preflight
    ctx.seed_all(5)
    model = ctx.model_factory(ctx.model_config).to(ctx.device)
    model.train()
    block = ctx.model_config.block_size
    probe_gen = ctx.generator(50)
    expert = ctx.params.model.ngram_expert
    if expert:  # the probes carry the n-gram the run mixes in: the rehearsal judges the mixture the run trains
        probes = [distill.draw_batch(ctx.splits["train"], pre.batch_size, block, ctx.device, probe_gen,
                                     ctx.soft_targets) for _ in range(pre.probe_batches)]
    else:
        probes = [batching.get_batch(ctx.splits["train"], pre.batch_size, block, ctx.device, probe_gen)
                  for _ in range(pre.probe_batches)]
    warmup = rehearsal_warmup(ctx)
    steps = warmup + pre.rehearsal_steps
    run_step = train_step.ScheduledStep(model, train, warmup_steps=warmup)  # the run's step, a shorter warmup
    log_p = unigram_log_probs(ctx.splits["train"], ctx.model_config.vocab_size)
    record = {"warmup_steps": warmup, "steps_at_peak": pre.rehearsal_steps, "batch_size": pre.batch_size,
              "precision": train.precision, "probe_batches": pre.probe_batches,
              "probe_loss_before": batch_loss.evaluate_model(model, probes, train.precision),
              "probe_unigram_loss": unigram_loss(probes, log_p), "unigram_entropy": unigram_entropy(log_p),
              "probe_ngram_loss": batch_loss.prior_loss(probes, ctx.model_config.vocab_size) if expert else None,
              "losses": [], "lrs": [],
              "failure": None}
    if expert:  # the gate can hide a network that diverges behind the n-gram: its own loss is judged too
        alone = [(x, y) for x, y, *_prior in probes]
        record["probe_network_loss_before"] = batch_loss.evaluate_model(model, alone, train.precision)
    gen = ctx.generator(5)
    for step in range(1, steps + 1):
        inputs, targets, soft = distill.draw_batch(ctx.splits["train"], pre.batch_size, block, ctx.device, gen,
                                                   ctx.soft_targets)
        result = run_step(inputs, targets, step, soft=soft)
        record["lrs"].append(result.lr)
        if not result.stepped:
            what = f"loss {result.loss}" if not math.isfinite(result.loss) else f"gradient norm {result.grad_norm}"
            first = first_non_finite_module(
                model, lambda: batch_loss.calc_loss_batch(model, inputs, targets, train.precision,
                                                          soft if run_step.expert else None))
            record["failure"] = (f"non-finite {what} at rehearsal step {step} (lr {result.lr:.3g}); first module "
                                 f"with a non-finite output: '{first}'")
            break
        record["losses"].append(result.loss)
    if record["failure"] is None:
        record["probe_loss_after"] = batch_loss.evaluate_model(model, probes, train.precision)
        if expert:
            record["probe_network_loss_after"] = batch_loss.evaluate_model(model, alone, train.precision)
    ctx.rehearsal = record
    return record


NETWORK_DIVERGED = 2.0  # model.ngram_expert: the network's own fixed-batch loss over its start that is divergence


def check_lr_stability(ctx: Context) -> dict:
    train, pre = ctx.params.train, ctx.params.preflight
    record = rehearse(ctx)
    losses, lrs = record["losses"], record["lrs"]
    measured = {k: v for k, v in record.items() if k not in ("losses", "lrs", "failure")}
    measured.update(lr=train.lr, losses=[round(v, 4) for v in losses], lrs=[float(f"{v:.6g}") for v in lrs],
                    max_lr_applied=max(lrs, default=0.0))
    if record["failure"]:
        raise CheckFailed(record["failure"], measured)
    # the schedule: the rehearsal must really reach the configured peak, and never leave (0, peak]
    out_of_range = [i + 1 for i, lr in enumerate(lrs) if not 0.0 < lr <= train.lr * (1 + 1e-9)]
    if out_of_range or max(lrs) < 0.9 * train.lr:
        raise CheckFailed(
            f"the schedule applied LRs {min(lrs):.3g} .. {max(lrs):.3g} (first bad step {out_of_range[:1] or '-'}), "
            f"outside (0, {train.lr:g}] or never near the configured peak {train.lr:g}: the LR schedule is broken",
            measured,
        )
    smooth = running_median(losses, 2 * SUSTAIN - 1)
    start = smooth[0]
    worst = max(range(len(smooth)), key=smooth.__getitem__)
    measured.update(start_loss=start, max_sustained_loss=smooth[worst], max_sustained_step=worst + 1)
    if smooth[worst] > start + pre.lr_rise_tolerance:
        raise CheckFailed(
            f"at lr {train.lr:g} the loss rose from {start:.4f} to {smooth[worst]:.4f} (running median over "
            f"{2 * SUSTAIN - 1} steps, step {worst + 1}; tolerance +{pre.lr_rise_tolerance}): the learning rate is too "
            "high for this model",
            measured,
        )
    if record["probe_loss_after"] > record["probe_loss_before"]:
        raise CheckFailed(
            f"at lr {train.lr:g} the loss on fixed train batches ended above where it started "
            f"({record['probe_loss_before']:.4f} -> {record['probe_loss_after']:.4f}): the learning rate is too high "
            "for this model",
            measured,
        )
    # the network alone, trained inside the mixture, learns what the n-gram misses, so its own loss may rise a
    # little at a healthy lr; a diverging one ends confidently wrong, several times its start (docs/preflight.md)
    before, after = record.get("probe_network_loss_before"), record.get("probe_network_loss_after")
    if before is not None and after > NETWORK_DIVERGED * before:
        raise CheckFailed(
            f"at lr {train.lr:g} the network's own loss on fixed train batches ended above {NETWORK_DIVERGED:g}x where "
            f"it started ({before:.4f} -> {after:.4f}) while the mixture with the n-gram (model.ngram_expert) fell to "
            f"{record['probe_loss_after']:.4f}: the gate hides a network the learning rate is too high for",
            measured,
        )
    return measured


def check_rehearsal_learns(ctx: Context) -> dict:
    """The model must have learned more than character frequencies: the fixed batches' loss ends clearly below
    what train's unigram distribution scores on those very batches (so a batch of rare text moves both). Under
    model.ngram_expert the loss is the mixture's, which starts near the n-gram's (probe_ngram_loss, recorded), far
    below the unigram's: there it must also end the margin below where it started, which the gate learning alone
    can do, so this proves the updates land, and optimizer_update that every parameter, the network's included,
    moves."""
    record, margin = ctx.rehearsal, ctx.params.preflight.learn_margin
    bar = record["probe_unigram_loss"] - margin
    if record["probe_ngram_loss"] is not None:
        bar = min(bar, record["probe_loss_before"] - margin)
    after = record["probe_loss_after"]
    measured = {"probe_loss_before": record["probe_loss_before"], "probe_loss_after": after,
                "probe_unigram_loss": record["probe_unigram_loss"],
                "unigram_entropy": record["unigram_entropy"], "probe_ngram_loss": record["probe_ngram_loss"],
                "log_v": math.log(ctx.model_config.vocab_size), "bar": bar, "steps": len(record["losses"])}
    ctx.summary["rehearsal_loss"] = after
    unit = "token" if isinstance(ctx.tokenizer, BPETokenizer) else "character"
    if not after <= bar:
        raise CheckFailed(
            f"after {len(record['losses'])} rehearsal steps the loss on fixed train batches is {after:.4f} (from "
            f"{record['probe_loss_before']:.4f}); train's {unit} frequencies alone score "
            f"{record['probe_unigram_loss']:.4f} on them, and a correctly updating model is at least {margin} below "
            f"that{' and below where it started' if record['probe_ngram_loss'] is not None else ''} by then "
            f"({bar:.4f}): the training step does not learn (updates that never land, an LR far too "
            f"low, or one so high that the model falls back to {unit} frequencies)",
            measured,
        )
    return measured


def overfit_run(ctx: Context) -> dict:
    """single_batch_overfit's model is preflight.overfit_model (the guide's debug model), whatever the run's,
    without dropout (memorising is the point)."""
    train, pre = ctx.params.train, ctx.params.preflight
    config = MiniGPTConfig.from_params(pre.overfit_model.model_copy(update={"dropout": 0.0}),
                                       ctx.model_config.vocab_size)
    ctx.seed_all(6)
    model = ctx.model_factory(config).to(ctx.device)
    model.train()
    # the run's optimizer and step at the check's own constant LR, without weight decay (memorising is the point)
    optimizer = train_step.make_optimizer(model, train, lr=pre.overfit_lr, weight_decay=0.0)
    inputs, targets = batching.get_batch(ctx.splits["train"], pre.overfit_batch_size, config.block_size, ctx.device,
                                         ctx.generator(6))
    losses, failure, final = [], None, None
    for step in range(1, pre.overfit_steps + 1):
        result = train_step.training_step(model, optimizer, inputs, targets, pre.overfit_lr, train.precision,
                                          train.grad_clip)
        if not result.stepped:
            failure = f"loss {result.loss} / gradient norm {result.grad_norm} at overfit step {step}"
            break
        losses.append(result.loss)
        if result.loss < pre.overfit_threshold:
            # memorised once the batch scores below the threshold in eval mode too: the remaining steps prove nothing
            final = batch_loss.evaluate_model(model, [(inputs, targets)], train.precision)
            if final < pre.overfit_threshold:
                break
    if final is None or final >= pre.overfit_threshold:
        final = batch_loss.evaluate_model(model, [(inputs, targets)], train.precision)
    reached = next((i for i, v in enumerate(losses) if v < pre.overfit_threshold), None)
    return {"final_loss": final, "steps_to_threshold": reached,
            "steps_run": len(losses),
            "loss_at": {str(i): round(losses[i], 4) for i in range(0, len(losses), max(1, len(losses) // 5))},
            "failure": failure}


def check_single_batch_overfit(ctx: Context) -> dict:
    pre = ctx.params.preflight
    main = overfit_run(ctx)
    ctx.summary["single_batch_final_loss"] = main["final_loss"]
    measured = {"model": pre.overfit_model.model_dump(),
                "batch": [pre.overfit_batch_size, pre.overfit_model.block_size], "steps": pre.overfit_steps,
                "lr": pre.overfit_lr, "precision": ctx.params.train.precision, "dropout_0.0": main}
    if main["failure"]:
        raise CheckFailed(main["failure"], measured)
    if not main["final_loss"] < pre.overfit_threshold:
        raise CheckFailed(
            f"a fresh debug model could not memorise one batch: final loss {main['final_loss']:.4f} after "
            f"{pre.overfit_steps} steps (threshold {pre.overfit_threshold})",
            measured,
        )
    return measured


CHECKS: tuple[Check, ...] = (
    Check("lr_stability", check_lr_stability, ("forward_shapes", "optimizer_update", "soft_targets_aligned"),
          lambda c: (f"the run's step, schedule and precision: {rehearsal_warmup(c)} warmup steps, then "
                     f"{c.params.preflight.rehearsal_steps} steps near the peak lr {c.params.train.lr:g} "
                     f"(batch {c.params.preflight.batch_size}): finite; LRs in (0, peak], the peak reached; the "
                     f"running median of {2 * SUSTAIN - 1} step losses never above the first + "
                     f"{c.params.preflight.lr_rise_tolerance}; fixed-batch loss lower after than before"
                     + (f" (the mixture's; the network's own not above {NETWORK_DIVERGED:g}x its start: "
                        "model.ngram_expert)" if c.params.model.ngram_expert else "")),
          ("learning rate too high for this model/batch", "no gradient clipping",
           "warmup needed (instability starts at the peak LR)", "a broken LR schedule (cosine_with_warmup)")),
    Check("rehearsal_learns", check_rehearsal_learns, ("lr_stability",),
          lambda c: (f"after the rehearsal, the loss on {c.params.preflight.probe_batches} fixed train batches <= "
                     f"the loss of train's character frequencies on them - {c.params.preflight.learn_margin}"
                     + (" (the mixture's, model.ngram_expert)" if c.params.model.ngram_expert else "")),
          ("updates never reach the weights (zero_grad between backward and step, optimizer over other tensors)",
           "learning rate far too low, or a schedule that sends it to zero", "gradients cut (detach / no_grad)",
           "inputs and targets misaligned, so there is nothing to learn")),
    Check("single_batch_overfit", check_single_batch_overfit,
          ("forward_shapes", "optimizer_update", "causal_independence"),
          lambda c: (f"fresh debug model, one batch, up to {c.params.preflight.overfit_steps} steps of the run's "
                     f"training step ({c.params.train.precision}): its loss < {c.params.preflight.overfit_threshold} "
                     "in eval mode (it stops there)"),
          ("the model cannot learn: broken residuals, wrong targets, or a bug in the loss",
           "learning rate far too low or too high",
           "data pipeline feeding different batches each step")),
)

