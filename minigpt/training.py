"""The training loop: gated by preflight, measured every step, checkpointed atomically, resumable, NaN-guarded.

Runs unchanged as a single process or under `torchrun --nproc_per_node=N stages/train.py` (DDP: gloo on CPU,
nccl on GPU). With N processes each rank draws batch_size / N windows from its own random stream, so the
effective batch (and therefore the LR) is the same as a single-process run; rank 0 alone logs, evaluates and
checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from minigpt import batching, train_step
from minigpt.code_binding import changed_files, code_fingerprint
from minigpt.checkpoint import CheckpointError, load_checkpoint, load_state_strict, save_checkpoint
from minigpt.config import Params
from minigpt.device import select_device
from minigpt.encoding import load_split
from minigpt.errors import ConfigError, DataError, MinigptError
from minigpt.gate import verify_gate
from minigpt.io_utils import (atomic_write_json, atomic_write_text, canonical_json_digest, remove_stale_temp_files,
                              sha256_file)
from minigpt.model import MiniGPT, MiniGPTConfig
from minigpt.nonfinite import NonFiniteTracker
from minigpt.train_step import calc_loss_batch, evaluate_model
from minigpt.paths import BEST_CHECKPOINT as BEST
from minigpt.paths import CURVES_PNG, ENCODED_DIR, MODELS_DIR, TOKENIZER_FILE, TRAIN_LOCK, TRAIN_LOG, TRAIN_METRICS
from minigpt.paths import LATEST_CHECKPOINT as LATEST
from minigpt.paths import TRAIN_PLOT_CSV, VAL_PLOT_CSV
from minigpt.run_control import RunLock, StopRequest, TrainingStopped
from minigpt.tokenizer import CharTokenizer

# train.* keys that may differ between a checkpoint and the run resuming it (they do not change the weights)
RESUME_FREE_KEYS = ("device", "compile", "resume_from")


class TrainingDiverged(MinigptError):
    """A non-finite loss or gradient stopped training; the last good checkpoint is intact."""


# ------------------------------------------------------------------------------------- the guide's helpers

def fixed_val_batches(val: torch.Tensor, count: int, batch_size: int, block_size: int, seed: int,
                      device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The validation batches, sliced once from their own seed: identical at every probe and every run."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    return [batching.get_batch(val, batch_size, block_size, device, gen) for _ in range(count)]


def generate_and_print_sample(model: MiniGPT, tokenizer: CharTokenizer, prompt: str, length: int,
                              device: torch.device, seed: int = 0, out: Callable[[str], None] = print) -> str:
    """Sample from a fixed prompt with its own generator (the training RNG is not touched)."""
    ids = torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long, device=device)[None, :]
    gen = torch.Generator(device=device).manual_seed(seed)
    text = tokenizer.decode(model.generate(ids, length, generator=gen)[0].tolist())
    out(f"[sample] {text!r}")
    return text


# ------------------------------------------------------------------------------------------- distributed

@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_pref: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
    if use_cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local)


def rank_device(pref: str, ddp: Dist) -> torch.device:
    device = select_device(pref)
    if device.type == "cuda" and ddp.world > 1:
        return torch.device("cuda", ddp.local_rank)
    return device


# --------------------------------------------------------------------------------------------- resume

def resume_fingerprint(params: Params, tokenizer_fp: str, root: Path) -> str:
    train = {k: v for k, v in params.section_dict("train").items() if k not in RESUME_FREE_KEYS}
    data = {s: sha256_file(root / ENCODED_DIR / f"{s}.npy") for s in ("train", "val")}
    return canonical_json_digest({"model": params.section_dict("model"), "train": train, "tokenizer": tokenizer_fp, "data": data})


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "numpy": _numpy_state(), "python": _python_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _numpy_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "cached": cached}


def _python_state() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def restore_rng(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    np_state = states["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def find_resume_checkpoint(params: Params, fingerprint: str, code: dict, root: Path, out) -> dict | None:
    """The checkpoint to continue from: train.resume_from (its data/model/settings must match; other code is
    allowed there, and said) or models/ latest when data, settings and code all match (else a fresh start, and why)."""
    explicit = params.train.resume_from
    path = Path(explicit) if explicit else root / LATEST
    if not explicit and not path.is_file():
        return None
    checkpoint = load_checkpoint(path)
    changed = changed_files(checkpoint.get("code_fingerprint"), code)
    if checkpoint.get("resume_fingerprint") != fingerprint:
        reason = f"{path} was written for other data/model/training settings"
        if explicit:
            raise CheckpointError(f"train.resume_from: {reason}; resume it with the config it was trained with, "
                                  "or set train.resume_from=null to start fresh.")
        out(f"[train] not resuming: {reason}; starting from step 0")
        return None
    if changed and not explicit:
        out(f"[train] not resuming: {path} was written by other code (changed: {', '.join(changed[:8])}"
            f"{' …' if len(changed) > 8 else ''}); starting from step 0. To continue it across the change on purpose, "
            f"set train.resume_from={path}")
        return None
    if changed:
        out(f"[train] train.resume_from: continuing {path} across a code change (changed: {', '.join(changed[:8])})")
    if checkpoint["step"] >= params.train.max_steps:
        if explicit:
            raise CheckpointError(f"train.resume_from: {path} is already at step {checkpoint['step']} of "
                                  f"train.max_steps = {params.train.max_steps}; there is nothing left to train.")
        out(f"[train] {path} already finished this exact run (same data, settings and code) at step "
            f"{checkpoint['step']}; nothing left to train. Delete it to train again.")
    checkpoint["path"] = str(path)
    return checkpoint


# --------------------------------------------------------------------------------------------- outputs

class RunLog:
    """reports/train_log.jsonl: one JSON line per step, flushed, so a crash leaves a readable file."""

    def __init__(self, path: Path, history: list[dict]):
        path.parent.mkdir(parents=True, exist_ok=True)
        # a resumed run rewrites the steps it keeps from the checkpoint: the log reads as one run
        self.handle = open(path, "w", encoding="utf-8")
        for record in history:
            self.write(record)

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def write_curves(history: list[dict], root: Path) -> None:
    """CSV plots for `dvc plots` (JSONL is not accepted there) and a PNG readable offline."""
    rows = ["step,train_loss,lr,grad_norm"] + [f"{r['step']},{r['train_loss']},{r['lr']},{r['grad_norm']}" for r in history]
    atomic_write_text(root / TRAIN_PLOT_CSV, "\n".join(rows) + "\n")
    val = [r for r in history if "val_loss" in r]
    atomic_write_text(root / VAL_PLOT_CSV, "\n".join(["step,val_loss"] + [f"{r['step']},{r['val_loss']}" for r in val]) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_loss.plot([r["step"] for r in history], [r["train_loss"] for r in history], label="train", alpha=0.6)
    ax_loss.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val")
    ax_loss.set_ylabel("loss (nats/char)")
    ax_loss.legend()
    ax_lr.plot([r["step"] for r in history], [r["lr"] for r in history])
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    fig.tight_layout()
    (root / CURVES_PNG).parent.mkdir(parents=True, exist_ok=True)
    tmp = root / CURVES_PNG.with_name(f".{CURVES_PNG.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, root / CURVES_PNG)


def check_models_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise MinigptError(f"{folder}/ is not writable ({exc.strerror}); checkpoints go there. "
                           "Fix its permissions or free the path, then rerun.") from None


# ------------------------------------------------------------------------------------------------ the loop

@dataclass
class Progress:
    step: int = 0
    best_val_loss: float = math.inf
    best_step: int = 0
    elapsed_s: float = 0.0
    clipped_steps: int = 0
    history: list[dict] = field(default_factory=list)
    stopped_by: str = "max_steps"


def _locate_nonfinite(raw_model: nn.Module, inputs, targets, precision: str) -> str | None:
    with NonFiniteTracker(raw_model) as tracker, torch.no_grad():
        calc_loss_batch(raw_model, inputs, targets, precision)
    return tracker.first


def train(params: Params, root: Path = Path("."), *, require_gate: bool = True,
          model_factory: Callable[[MiniGPTConfig], nn.Module] = MiniGPT, out: Callable[[str], None] = print) -> dict:
    cfg = params.train
    ddp = init_distributed(cfg.device)
    say = out if ddp.main else (lambda _msg: None)
    if require_gate:
        verify_gate(params, root)
    if cfg.batch_size % ddp.world:
        raise ConfigError(f"'train.batch_size' = {cfg.batch_size} must be divisible by the {ddp.world} processes")
    if ddp.main:
        check_models_writable(root / MODELS_DIR)
    # one trainer per folder: the lock is taken before the first write and released however the run ends
    with (RunLock(root / TRAIN_LOCK) if ddp.main else nullcontext()), StopRequest() as stop:
        if ddp.main:
            for stale in remove_stale_temp_files(root / MODELS_DIR, "*.pt"):
                say(f"[train] removed {stale}, left by a checkpoint write that was killed half-way")
        return _train(params, root, ddp, say, stop, model_factory)


def _train(params: Params, root: Path, ddp: Dist, say, stop: StopRequest, model_factory) -> dict:
    cfg = params.train
    device = rank_device(cfg.device, ddp)
    tokenizer = CharTokenizer.load(root / TOKENIZER_FILE)
    train_ids, val_ids = load_split(root / ENCODED_DIR, "train"), load_split(root / ENCODED_DIR, "val")
    config = MiniGPTConfig.from_params(params.model, tokenizer.vocab_size)
    for split, ids in (("train", train_ids), ("val", val_ids)):
        if ids.numel() < config.block_size + 1:
            raise DataError(f"{root / ENCODED_DIR / split}.npy: {ids.numel()} tokens, fewer than one window of "
                            f"model.block_size + 1 = {config.block_size + 1}; use more text or a smaller block_size.")
    fingerprint = resume_fingerprint(params, tokenizer.fingerprint, root)
    code = code_fingerprint()
    binding = {"resume_fingerprint": fingerprint, "code_fingerprint": code}  # what auto-resume requires to match

    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    model = model_factory(config).to(device)
    optimizer = train_step.make_optimizer(model, cfg)
    batch_gen = torch.Generator().manual_seed(cfg.seed * 1000 + ddp.rank)  # different data on every rank
    progress = Progress()

    checkpoint = find_resume_checkpoint(params, fingerprint, code, root, say)
    if checkpoint is not None:
        load_state_strict(model, checkpoint, checkpoint["path"])
        optimizer.load_state_dict(checkpoint["optimizer_state"])  # moves state to the parameters' device
        restore_rng(checkpoint["rng"])
        if len(checkpoint["batch_rng"]) != ddp.world:
            raise CheckpointError(f"{checkpoint['path']} was written by {len(checkpoint['batch_rng'])} process(es); "
                                  f"resume it with the same number (now {ddp.world}).")
        batch_gen.set_state(checkpoint["batch_rng"][ddp.rank])
        progress = Progress(checkpoint["step"], checkpoint["best_val_loss"], checkpoint["best_step"],
                            checkpoint["elapsed_s"], checkpoint["clipped_steps"], list(checkpoint["history"]))
        say(f"[train] resuming from {checkpoint['path']} at step {progress.step}")

    raw_model = model
    if cfg.compile:
        model = torch.compile(model)
    if ddp.world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    val_batches = fixed_val_batches(val_ids, cfg.eval_batches, cfg.batch_size, config.block_size, cfg.seed, device)
    per_rank_batch = cfg.batch_size // ddp.world
    tokens_per_step = cfg.batch_size * config.block_size
    log = RunLog(root / TRAIN_LOG, progress.history) if ddp.main else None
    budget = cfg.max_seconds
    say(f"[train] {raw_model.num_parameters():,} parameters on {device} ({cfg.precision}, world {ddp.world}); "
        f"steps {progress.step + 1}..{cfg.max_steps}{f' or {budget:g} s of wall clock' if budget else ''}, "
        f"{tokens_per_step:,} tokens/step")
    bar = _progress_bar(cfg.max_steps, progress.step, ddp.main)
    report_every = max(1, cfg.max_steps // 20)
    next_report_s = progress.elapsed_s + (budget or math.inf) / 20
    model.train()
    try:
        for step in range(progress.step + 1, cfg.max_steps + 1):
            started = time.perf_counter()
            time_fraction = progress.elapsed_s / budget if budget else 0.0
            lr = train_step.scheduled_lr(cfg, step, time_fraction)
            inputs, targets = batching.get_batch(train_ids, per_rank_batch, config.block_size, device, batch_gen)
            # the pre-clip norm is identical on every rank after DDP's all-reduce, so all ranks stop together
            result = train_step.training_step(model, optimizer, inputs, targets, lr, cfg.precision, cfg.grad_clip,
                                              raw_model.parameters())
            loss_value, grad_norm = result.loss, result.grad_norm
            if not result.stepped:
                _raise_diverged(step, loss_value, grad_norm, raw_model, inputs, targets, cfg.precision, progress, root)
            progress.step = step
            progress.clipped_steps += grad_norm > cfg.grad_clip
            step_s = time.perf_counter() - started
            progress.elapsed_s = _agreed_clock(progress.elapsed_s + step_s, ddp, budget, device)
            out_of_time = budget is not None and progress.elapsed_s >= budget
            record = {"step": step, "train_loss": round(loss_value, 6), "lr": lr, "grad_norm": round(grad_norm, 6),
                      "tokens_per_sec": round(tokens_per_step / step_s, 1), "elapsed_s": round(progress.elapsed_s, 3)}
            if step % cfg.eval_every == 0 or step == cfg.max_steps or out_of_time:
                eval_started = time.perf_counter()
                batch_rng = _gather_batch_rng(batch_gen, ddp)  # every rank takes part
                if ddp.main:
                    _evaluate_and_checkpoint(record, raw_model, val_batches, tokenizer, cfg, device, progress,
                                             optimizer, batch_rng, binding, root, say)
                if ddp.world > 1:
                    dist.barrier()
                # evaluation and checkpoints spend the budget too: the clock is the loop's wall clock (agreed
                # again, or ranks would enter the next step with clocks a few microseconds apart, hence other LRs)
                progress.elapsed_s = _agreed_clock(progress.elapsed_s + time.perf_counter() - eval_started, ddp,
                                                   budget, device)
            progress.history.append(record)
            if log is not None:
                log.write(record)
            if _agreed_stop(stop, ddp, device):
                batch_rng = _gather_batch_rng(batch_gen, ddp)
                if ddp.main:
                    save_checkpoint(root / LATEST, raw_model, tokenizer.fingerprint,
                                    **_checkpoint_state(progress, progress.history, optimizer, batch_rng, binding, cfg))
                raise TrainingStopped(
                    f"stopped at step {step} ({stop.reason}); {LATEST} holds that step. Resume with `dvc repro` "
                    "(or `python stages/train.py`): the run continues where it stopped, as if never interrupted.",
                    stop.exit_code)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_sec']:.0f}")
            elif ddp.main and (step % report_every == 0 or step == cfg.max_steps or out_of_time
                               or progress.elapsed_s >= next_report_s):
                next_report_s = progress.elapsed_s + (budget or math.inf) / 20
                say(f"[train] step {step}/{cfg.max_steps} ({progress.elapsed_s:.0f} s) loss {loss_value:.4f} lr {lr:.2e} "
                    f"grad_norm {grad_norm:.3f} {record['tokens_per_sec']:.0f} tok/s")
            if out_of_time:
                progress.stopped_by = "max_seconds"
                break
    finally:
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
    summary = _summary(progress, cfg, device, ddp, raw_model, checkpoint)
    if ddp.main:
        write_curves(progress.history, root)
        atomic_write_json(root / TRAIN_METRICS, summary)
        say(f"[train] done: best val loss {summary['best_val_loss']:.4f} at step {summary['best_step']}, "
            f"{summary['tokens_per_sec_median']:.0f} tok/s, clipped {summary['clipped_fraction']:.1%} of steps")
    if ddp.world > 1:
        dist.barrier()
    return summary


def _agreed_clock(elapsed_s: float, ddp: Dist, budget: float | None, device: torch.device) -> float:
    """The slowest rank's clock, so that under a time budget every rank applies the same LR and stops together."""
    if budget is None:
        return elapsed_s
    return _max_over_ranks(elapsed_s, ddp, device)


def _max_over_ranks(value: float, ddp: Dist, device: torch.device) -> float:
    """The largest of every rank's value (the value itself in a single process)."""
    if ddp.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)  # nccl reduces GPU tensors only
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def _gather_batch_rng(batch_gen: torch.Generator, ddp: Dist) -> list[torch.Tensor]:
    """Every rank's batch-sampler state, so a resumed run draws the same batches on every rank."""
    if ddp.world == 1:
        return [batch_gen.get_state()]
    gathered = [None] * ddp.world
    dist.all_gather_object(gathered, batch_gen.get_state())
    return gathered


def _evaluate_and_checkpoint(record, model, val_batches, tokenizer, cfg, device, progress, optimizer, batch_rng,
                             binding, root, say) -> None:
    val_loss = evaluate_model(model, val_batches, cfg.precision)
    record["val_loss"] = round(val_loss, 6)
    if cfg.sample_length:
        record["sample"] = generate_and_print_sample(model, tokenizer, cfg.sample_prompt, cfg.sample_length, device,
                                                     cfg.seed, say)
    improved = val_loss < progress.best_val_loss
    if improved:
        progress.best_val_loss, progress.best_step = val_loss, progress.step
    say(f"[train] step {progress.step}: val loss {val_loss:.4f}{' (best)' if improved else ''}")
    state = _checkpoint_state(progress, progress.history + [record], optimizer, batch_rng, binding, cfg)
    if improved:
        save_checkpoint(root / BEST, model, tokenizer.fingerprint, **state)
    save_checkpoint(root / LATEST, model, tokenizer.fingerprint, **state)


def _checkpoint_state(progress: Progress, history: list[dict], optimizer, batch_rng, binding: dict, cfg) -> dict:
    """Everything a resumed run needs to continue bit for bit, beside the model (save_checkpoint adds it)."""
    return dict(
        optimizer_state=optimizer.state_dict(), step=progress.step, best_val_loss=progress.best_val_loss,
        best_step=progress.best_step, elapsed_s=progress.elapsed_s, clipped_steps=progress.clipped_steps,
        history=history, rng=rng_states(), batch_rng=batch_rng, **binding, train_config=dict(vars(cfg)),
    )


def _agreed_stop(stop: StopRequest, ddp: Dist, device: torch.device) -> bool:
    """Whether any rank was asked to stop (a signal may reach one rank only): all ranks stop at the same step."""
    return _max_over_ranks(1.0 if stop.requested else 0.0, ddp, device) > 0


def _raise_diverged(step, loss_value, grad_norm, raw_model, inputs, targets, precision, progress, root) -> None:
    what = f"loss {loss_value}" if not math.isfinite(loss_value) else f"gradient norm {grad_norm}"
    module = _locate_nonfinite(raw_model, inputs, targets, precision)
    bad_grads = [n for n, p in raw_model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    where = f"first module with non-finite output: '{module}'" if module else (
        "the forward pass is finite; non-finite gradients in: " + ", ".join(bad_grads[:8]))
    latest = root / LATEST
    kept = f"the last good checkpoint {latest} (step {_checkpoint_step(latest)}) is left intact" if latest.is_file() else "no checkpoint was written yet"
    raise TrainingDiverged(
        f"non-finite {what} at step {step} (last finite step {step - 1}); {where}; {kept}. "
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


def _summary(progress: Progress, cfg, device, ddp: Dist, model, checkpoint) -> dict:
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
        "resumed_from_step": checkpoint["step"] if checkpoint else None,
        "parameters": model.num_parameters(),
        "device": str(device),
        "precision": cfg.precision,
        "world_size": ddp.world,
    }
