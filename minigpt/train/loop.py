"""The training loop: gated by preflight, measured every step, checkpointed atomically, resumable, NaN-guarded.

Runs unchanged as a single process or under `torchrun --nproc_per_node=N stages/train.py` (DDP: gloo on CPU,
nccl on GPU). With N processes each rank draws batch_size / N windows from its own random stream, so the
effective batch (and therefore the LR) is the same as a single-process run; rank 0 alone logs, evaluates and
checkpoints. The step itself is train_step.training_step, the one preflight rehearses.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from minigpt.core import provenance, thread_share
from minigpt.core.config import Params
from minigpt.core.errors import ConfigError, MinigptError
from minigpt.core.io_utils import atomic_write_json, remove_stale_temp_files
from minigpt.core.paths import (
    BEST_CHECKPOINT,
    LATEST_CHECKPOINT,
    MODELS_DIR,
    TRAIN_LOCK,
    TRAIN_SUMMARY,
)
from minigpt.core.provenance import Custody
from minigpt.data.tokenizer_files import Tokenizer
from minigpt.model import batch_loss
from minigpt.model.checkpoint import (
    load_checkpoint,
)
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.model.nonfinite import first_non_finite_module
from minigpt.model.sampling import SamplingSettings, sample_text
from minigpt.train import distill, distributed, schedule_spec, train_step
from minigpt.train.gate import verify_gate
from minigpt.train.machine_choice import require_resolved_precision
from minigpt.train.run_control import RunLock, StopRequest, TrainingStopped
from minigpt.train.run_log import write_curves
from minigpt.train.run_state import Run, prepare_run
from minigpt.train.training_checks import TrainingChecks
from minigpt.train.watchdogs import Watchdogs, WatchdogStop

REBALANCE_EVERY = 25  # steps between two looks at how many minigpt processes share the cores


class TrainingDiverged(MinigptError):
    """A non-finite loss or gradient stopped training; the last good checkpoint is intact."""


def generate_and_print_sample(model: MiniGPT, tokenizer: Tokenizer, prompt: str, length: int,
                              device: torch.device, seed: int = 0, out: Callable[[str], None] = print,
                              prior_of=None) -> str:
    """The prompt and `length` characters sampled after it (plain sampling, its own generator: the training RNG is
    not touched), printed; prior_of: the n-gram mixed in under model.ngram_expert."""
    text = prompt + sample_text(model, tokenizer, prompt, SamplingSettings(), length, seed, device, prior_of)
    out(f"[sample] {text!r}")
    return text


def check_models_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise MinigptError(f"{folder}/ is not writable ({exc.strerror}); checkpoints go there. "
                           "Fix its permissions or free the path, then rerun.") from None


def train(params: Params, root: Path = Path("."), *, require_gate: bool = True,
          model_factory: Callable[[MiniGPTConfig], nn.Module] = MiniGPT, out: Callable[[str], None] = print,
          stop_at_step: int | None = None, curves_png: bool = True) -> dict:
    """stop_at_step: stop after that step as a Ctrl-C would (checkpoint, then TrainingStopped); preflight's resume
    check interrupts a run this way, and passes curves_png=False (its scratch runs' PNG, a second of drawing, is
    never read)."""
    cfg = params.train
    ddp = distributed.init_distributed(cfg.device)
    say = out if ddp.main else (lambda _msg: None)
    reference = None  # `make machine`'s tokens/s for this run's step, the throughput watchdog's reference
    custody = Custody("train", root)
    if require_gate:
        gate = verify_gate(params, root)
        custody.take("preflight report")
        if gate.machine is not None:  # the machine's measured choice, proven to be this machine's by the gate
            say(f"[train] {gate.machine.file}: precision {gate.machine.precision}"
                f"{f', shape {gate.machine.shape}' if gate.machine.shape else ''} ({gate.machine.how})")
            reference = gate.machine.tokens_per_s
    else:
        require_resolved_precision(params)
    cfg = params.train
    if cfg.batch_size % ddp.world:
        raise ConfigError(f"'train.batch_size' = {cfg.batch_size} must be divisible by the {ddp.world} processes")
    if ddp.main:
        check_models_writable(root / MODELS_DIR)
    # one trainer per folder: the lock is taken before the first write and released however the run ends
    with (RunLock(root / TRAIN_LOCK, say) if ddp.main else nullcontext()), StopRequest(stop_at_step) as stop:
        if ddp.main:
            for stale in remove_stale_temp_files(root / MODELS_DIR, "*.pt"):
                say(f"[train] removed {stale}, left by a checkpoint write that was killed half-way")
            provenance.forget(root, "train")  # written again when the run completes
        run = prepare_run(params, root, ddp, say, model_factory, custody)
        run.watch = Watchdogs(params.watch, params.train.grad_clip, params.clean.placeholder, reference, say)
        run.curves_png = curves_png
        summary = _loop(run, stop)
        if ddp.main:
            custody.made(*provenance.TRAIN_OUTPUTS)
            custody.write()
        return summary


def _loop(run: Run, stop: StopRequest) -> dict:
    cfg, ddp, progress, device, say = run.cfg, run.ddp, run.progress, run.device, run.say
    block = run.params.model.block_size
    val_batches = batch_loss.fixed_val_batches(run.val_ids, cfg.eval_batches, cfg.batch_size, block, cfg.seed, device,
                                               run.val_priors)
    if run.val_priors is not None:  # val_improving's reference: what the n-gram alone scores on these batches
        run.watch.ngram_val_loss = batch_loss.prior_loss(val_batches, run.raw_model.config.vocab_size)
    per_rank_batch = cfg.batch_size // ddp.world
    tokens_per_step = cfg.batch_size * block
    budget = cfg.max_seconds
    say(f"[train] {run.raw_model.num_parameters():,} parameters on {device} ({cfg.precision}, world {ddp.world}); "
        f"steps {progress.step + 1}..{cfg.max_steps}{f' or {budget:g} s of wall clock' if budget else ''}, "
        f"{tokens_per_step:,} tokens/step")
    bar = _progress_bar(cfg.max_steps, progress.step, ddp.main)
    report = _ConsoleReport(cfg.max_steps, budget, progress.elapsed_s)
    checks = TrainingChecks(progress.best_step, progress.best_val_loss)
    run.model.train()
    try:
        for step in range(progress.step + 1, cfg.max_steps + 1):
            if step % REBALANCE_EVERY == 1:
                # other minigpt processes started or ended: take this process's share
                run.threads_used.add(thread_share.rebalance())
            started = time.perf_counter()
            inputs, targets, soft = distill.draw_batch(run.train_ids, per_rank_batch, block, device, run.batch_gen,
                                                       run.soft_targets)
            # the pre-clip norm is identical on every rank after DDP's all-reduce, so all ranks stop together
            clock_fraction = progress.elapsed_s / budget if budget else 0.0
            result = run.scheduled_step(inputs, targets, step, clock_fraction, soft)
            lr = result.lr  # what the optimizer applied; lr_applied holds it to the specification, from params alone
            specified = schedule_spec.specified_lr(cfg, step, clock_fraction)
            if not result.stepped:
                _raise_diverged(run, step, result, inputs, targets, soft if run.scheduled_step.expert else None)
            if run.average is not None:
                run.average.update(run.raw_model)
            progress.step = step
            progress.clipped_steps += result.grad_norm > cfg.grad_clip
            step_s = time.perf_counter() - started
            progress.elapsed_s = distributed.agreed_clock(progress.elapsed_s + step_s, ddp, budget, device)
            out_of_time = budget is not None and progress.elapsed_s >= budget
            record = {"step": step, "train_loss": round(result.loss, 6), "lr": lr,
                      "grad_norm": round(result.grad_norm, 6),
                      "tokens_per_sec": round(tokens_per_step / step_s, 1), "elapsed_s": round(progress.elapsed_s, 3)}
            _watch(run, record,
                   lambda: run.watch.after_step(step, specified, run.scheduled_step.optimizer, run.raw_model,
                                                result.grad_norm, result.loss, record["tokens_per_sec"]))
            if step % cfg.eval_every == 0 or step == cfg.max_steps or out_of_time:
                eval_started = time.perf_counter()
                improved = _evaluate(run, record, val_batches, checks) if ddp.main else False
                # before this eval's checkpoints: a stop here leaves the previous ones
                _watch(run, record, lambda: run.watch.after_eval(step, record["val_loss"], record.get("sample"))
                       if ddp.main else [], agree=True)
                _append(run, record)
                run.save_checkpoints([BEST_CHECKPOINT, LATEST_CHECKPOINT] if improved else [LATEST_CHECKPOINT])
                distributed.barrier(ddp)
                # evaluation and checkpoints spend the budget too: the clock is the loop's wall clock (agreed
                # again, or ranks would enter the next step with clocks a few microseconds apart, hence other LRs)
                progress.elapsed_s = distributed.agreed_clock(progress.elapsed_s + time.perf_counter() - eval_started,
                                                          ddp, budget, device)
            else:
                _append(run, record)
            if distributed.any_rank(stop.requested_after(step), ddp, device):
                run.save_checkpoints([LATEST_CHECKPOINT])
                raise TrainingStopped(
                    f"stopped at step {step} ({stop.reason}); {LATEST_CHECKPOINT} holds that step. Resume with "
                    "`dvc repro` (or `python stages/train.py`): the run continues where it stopped, as if never "
                    "interrupted.",
                    stop.exit_code)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{result.loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_sec']:.0f}")
            elif ddp.main and report.due(step, progress.elapsed_s, out_of_time):
                say(f"[train] step {step}/{cfg.max_steps} ({progress.elapsed_s:.0f} s) loss {result.loss:.4f} "
                    f"lr {lr:.2e} grad_norm {result.grad_norm:.3f} {record['tokens_per_sec']:.0f} tok/s")
            if out_of_time:
                progress.stopped_by = "max_seconds"
                break
    finally:
        if bar is not None:
            bar.close()
        if run.log is not None:
            run.log.close()
    summary = _summary(run)
    if ddp.main:
        summary["checks"] = checks.records(progress.history, run.root / BEST_CHECKPOINT)
        write_curves(progress.history, run.root, png=run.curves_png)
        atomic_write_json(run.root / TRAIN_SUMMARY, summary)
        say(f"[train] done: best val loss {summary['best_val_loss']:.4f} at step {summary['best_step']}, "
            f"{summary['tokens_per_sec_median']:.0f} tok/s, clipped {summary['clipped_fraction']:.1%} of steps, "
            f"{summary['warnings']} watchdog warning(s)")
    distributed.barrier(ddp)
    return summary


def _watch(run: Run, record: dict, check: Callable[[], list[dict]], agree: bool = False) -> None:
    """The watchdogs' events into the step's record; a stop logs that record and ends the run with one line.
    agree: the check ran on rank 0 alone, so every rank learns whether it stopped (the per-step checks see the
    same LR and the same all-reduced gradients on every rank, so they agree by themselves)."""
    stopped = None
    try:
        events = check()
    except WatchdogStop as exc:
        stopped, events = exc, [exc.event]
    if events:
        record.setdefault("watch", []).extend(events)
    if agree:
        if not distributed.any_rank(stopped is not None, run.ddp, run.device):
            return
        stopped = stopped or WatchdogStop(f"a watchdog on rank 0 stopped the run at step {record['step']}", {})
    elif stopped is None:
        return
    _append(run, record)
    raise WatchdogStop(f"{stopped}; {_kept(run)}. The run log has the step's record ('watch').", stopped.event)


def _kept(run: Run) -> str:
    latest = run.root / LATEST_CHECKPOINT
    if latest.is_file():
        return f"the last good checkpoint {latest} (step {_checkpoint_step(latest)}) is left intact"
    return "no checkpoint was written yet"


def _append(run: Run, record: dict) -> None:
    """The step's record into the history and (rank 0) the log, before any checkpoint of that step is saved."""
    run.progress.history.append(record)
    if run.log is not None:
        run.log.write(record)


def _evaluate(run: Run, record: dict, val_batches, checks: TrainingChecks) -> bool:
    """Validation loss (and a sample) into the step's record; whether it is the best so far."""
    cfg, progress = run.cfg, run.progress
    with checks.validating(run.scored_model, progress.step):
        val_loss = batch_loss.evaluate_model(run.scored_model, val_batches, cfg.precision)
    record["val_loss"] = round(val_loss, 6)
    if run.average is not None:  # the average is what counts; the trained weights' loss beside it shows its gain
        with checks.validating(run.raw_model, progress.step):
            val_trained = batch_loss.evaluate_model(run.raw_model, val_batches, cfg.precision)
        record["val_loss_trained"] = round(val_trained, 6)
    if cfg.sample_length:
        record["sample"] = generate_and_print_sample(run.scored_model, run.tokenizer, cfg.sample_prompt,
                                                     cfg.sample_length, run.device, cfg.seed, run.say,
                                                     run.next_token_ngram)
    improved = val_loss < progress.best_val_loss
    if improved:
        progress.best_val_loss, progress.best_step = val_loss, progress.step
    trained = f" (trained weights {record['val_loss_trained']:.4f})" if "val_loss_trained" in record else ""
    run.say(f"[train] step {progress.step}: val loss {val_loss:.4f}{trained}{' (best)' if improved else ''}")
    return improved


class _ConsoleReport:
    """When to print a progress line without a terminal: every 5% of the steps or of the time budget."""

    def __init__(self, max_steps: int, budget: float | None, elapsed_s: float):
        self.max_steps, self.budget = max_steps, budget
        self.every = max(1, max_steps // 20)
        self.next_s = elapsed_s + (budget or math.inf) / 20

    def due(self, step: int, elapsed_s: float, out_of_time: bool) -> bool:
        if step % self.every and step != self.max_steps and not out_of_time and elapsed_s < self.next_s:
            return False
        self.next_s = elapsed_s + (self.budget or math.inf) / 20
        return True


def _raise_diverged(run: Run, step: int, result: train_step.StepResult, inputs, targets, prior=None) -> None:
    """prior: the step's n-gram under model.ngram_expert (the forward replayed is the one that ran)."""
    what = f"loss {result.loss}" if not math.isfinite(result.loss) else f"gradient norm {result.grad_norm}"
    first = first_non_finite_module(
        run.raw_model, lambda: batch_loss.calc_loss_batch(run.raw_model, inputs, targets, run.cfg.precision, prior))
    bad_grads = [n for n, p in run.raw_model.named_parameters()
                 if p.grad is not None and not torch.isfinite(p.grad).all()]
    where = f"first module with non-finite output: '{first}'" if first else (
        "the forward pass is finite; non-finite gradients in: " + ", ".join(bad_grads[:8]))
    raise TrainingDiverged(
        f"non-finite {what} at step {step} (last finite step {step - 1}); {where}; {_kept(run)}. "
        "Lower train.lr, check grad_clip and the data, then rerun (preflight's lr_stability tests the peak LR)."
    )


def _checkpoint_step(path: Path):
    try:
        return load_checkpoint(path)["step"]
    except MinigptError:
        return "?"


def _progress_bar(total: int, done: int, main: bool):
    if not (main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True)


def _summary(run: Run) -> dict:
    progress, cfg = run.progress, run.cfg
    rates = sorted(r["tokens_per_sec"] for r in progress.history) or [0.0]
    return {
        "steps": progress.step,
        "final_train_loss": progress.history[-1]["train_loss"] if progress.history else None,
        "best_val_loss": progress.best_val_loss,
        "best_step": progress.best_step,
        "train_seconds": round(progress.elapsed_s, 2),
        "stopped_by": progress.stopped_by,
        "max_seconds": cfg.max_seconds,
        "tokens_per_sec_median": rates[len(rates) // 2],
        "clipped_fraction": progress.clipped_steps / max(1, progress.step),
        # this process's watchdogs (a resumed run's count from where it resumed)
        "warnings": run.watch.summary()["warnings"] if run.watch else 0,
        "watchdogs": run.watch.summary() if run.watch else None,
        "resumed_from_step": run.resumed_from,
        "parameters": run.raw_model.num_parameters(),
        "model": run.params.section_dict("model"),  # the model trained (params.yaml's, a budget shape's included)
        "shape": run.params.shape,
        "device": str(run.device),
        "precision": cfg.precision,
        "ema_decay": cfg.ema_decay,  # not null: the val losses and checkpoints are the moving average's
        "world_size": run.ddp.world,
        "threads": sorted(run.threads_used),  # this process's share of the cores over the run (several: it changed)
    }
