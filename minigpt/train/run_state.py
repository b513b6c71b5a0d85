"""One training run's state: its settings, process, data, model, scheduled step and samplers, and its progress;
set up from the data (seeded) and, when auto-resume finds one, continued from a checkpoint; saved as checkpoints of
the current step."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from minigpt.core.code_binding import code_fingerprint
from minigpt.core.config import Params
from minigpt.core.errors import DataError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR, TRAIN_LOG
from minigpt.core.provenance import Custody
from minigpt.data.encode import load_split
from minigpt.data.soft_target_files import (
    NextTokenNgram,
    Priors,
    SoftTargets,
    load_heldout_priors,
    load_next_token_ngram,
    load_soft_targets,
    ngram_identity,
)
from minigpt.data.tokenizer_files import Tokenizer, load_tokenizer
from minigpt.model.checkpoint import CheckpointError, load_state_strict, save_checkpoint
from minigpt.model.gpt import MiniGPTConfig
from minigpt.train import distributed, train_step
from minigpt.train.distributed import Dist
from minigpt.train.resume import find_resume_checkpoint, restore_rng, resume_fingerprint, rng_states
from minigpt.train.run_log import RunLog, history_for_resume
from minigpt.train.state_digest import part_digests, state_digest
from minigpt.train.watchdogs import Watchdogs
from minigpt.train.weight_average import WeightAverage


@dataclass
class Progress:
    step: int = 0
    best_val_loss: float = math.inf
    best_step: int = 0
    elapsed_s: float = 0.0
    clipped_steps: int = 0
    history: list[dict] = field(default_factory=list)
    stopped_by: str = "max_steps"


@dataclass
class Run:
    """What the loop's helpers share: the settings, the process, the model and optimizer, and the progress."""
    params: Params
    root: Path
    ddp: Dist
    device: torch.device
    say: Callable[[str], None]
    tokenizer: Tokenizer
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    raw_model: nn.Module  # the plain MiniGPT: evaluated, clipped and saved
    scheduled_step: train_step.ScheduledStep  # the optimizer, the LR schedule and the step that applies them
    batch_gen: torch.Generator
    binding: dict  # the resume and code fingerprints that auto-resume requires to match
    progress: Progress = field(default_factory=Progress)
    model: nn.Module | None = None  # what trains: raw_model, compiled and/or DDP-wrapped
    log: RunLog | None = None  # rank 0 only
    resumed_from: int | None = None  # the checkpoint's step when this run continues one
    watch: Watchdogs | None = None
    threads_used: set[int] = field(default_factory=set)  # torch's threads at each rebalance (thread_share)
    average: WeightAverage | None = None  # train.ema_decay: the weights evaluated, kept as best and sampled
    soft_targets: SoftTargets | None = None  # params.uses_soft_targets(): every train position's soft target
    val_priors: Priors | None = None  # model.ngram_expert: the n-gram at val positions, for the in-run evaluations
    next_token_ngram: NextTokenNgram | None = None  # model.ngram_expert with samples: the n-gram they mix in
    custody: Custody | None = None  # the provenance record of what the run read (written when it completes)
    curves_png: bool = True  # draw reports/train_curves.png at the end (the CSV plots are always written)

    @property
    def scored_model(self) -> nn.Module:
        """The weights the run evaluates and keeps: the moving average when there is one, else the trained ones."""
        return self.average.model if self.average is not None else self.raw_model

    @property
    def cfg(self):
        return self.params.train

    def save_checkpoints(self, names: list[Path]) -> None:
        """Checkpoints of the current step (every rank takes part: the batch samplers' states are gathered)."""
        batch_rng = distributed.gather_generator_states(self.batch_gen, self.ddp)
        if not self.ddp.main:
            return
        p = self.progress
        rng = rng_states()
        state = dict(
            optimizer_state_dict=self.scheduled_step.optimizer.state_dict(), step=p.step, best_val_loss=p.best_val_loss,
            best_step=p.best_step, elapsed_s=p.elapsed_s, clipped_steps=p.clipped_steps, rng=rng,
            batch_rng=batch_rng, train_config=self.cfg.model_dump(), **self.binding, **self.log.mark(),
            # what a resume must restore, part by part (continue_from recomputes them from the restored objects)
            part_digests=self.part_digests(rng, [state_digest(s) for s in batch_rng]),
        )
        if getattr(self.raw_model.config, "ngram_expert", False):  # evaluate and generate refuse any other n-gram
            state["ngram_expert_source"] = ngram_identity(self.soft_targets.summary)
        if self.average is not None:
            # model_state_dict is the average (what evaluate and generate load); the trained weights resume the run
            state.update(trained_state_dict=self.raw_model.state_dict(), average_updates=self.average.updates)
        for name in names:
            save_checkpoint(self.root / name, self.scored_model, self.tokenizer.fingerprint, **state)


    def part_digests(self, rng: dict, batch_streams: list[str]) -> dict:
        """Every resumable part's fingerprint, from the live objects (the batch stream: one per rank)."""
        p = self.progress
        position = {"step": p.step, "best_val_loss": p.best_val_loss, "best_step": p.best_step,
                    "elapsed_s": p.elapsed_s, "clipped_steps": p.clipped_steps}
        average = None if self.average is None else {"state": self.average.model.state_dict(),
                                                     "updates": self.average.updates}
        parts = part_digests(self.raw_model.state_dict(), self.scheduled_step.optimizer.state_dict(), average,
                             position, rng)
        return {**parts, "batch stream": batch_streams}


def verify_restored(run: "Run", checkpoint: dict) -> None:
    """After a resume: every part the checkpoint fingerprinted, recomputed from the restored objects, must match;
    else the restore is broken and the run stops before its first step, naming the parts."""
    expected = checkpoint.get("part_digests")
    if not expected:
        run.say(f"[train] {checkpoint['path']} records no fingerprints of its parts (written by an older minigpt): "
                "the resume is not verified")
        return
    actual = run.part_digests(rng_states(), [None] * run.ddp.world)
    actual["batch stream"] = expected["batch stream"][:]
    actual["batch stream"][run.ddp.rank] = state_digest(run.batch_gen.get_state())
    wrong = [part for part in expected if actual.get(part) != expected[part]]
    if wrong:
        raise CheckpointError(f"{checkpoint['path']}: after the resume, the {', '.join(wrong)} differ from what the "
                              "checkpoint recorded when it was written: the restore is broken "
                              "(minigpt/train/run_state.py continue_from), so the run would not continue as if "
                              "uninterrupted. Not training on it.")
    run.say(f"[train] resume verified: {', '.join(expected)} equal the checkpoint's fingerprints")


def prepare_run(params: Params, root: Path, ddp: Dist, say, model_factory, custody: Custody) -> Run:
    """Data (each file checked against the record of the stage that made it), model, optimizer and samplers
    seeded, then the checkpoint (if any) this run continues."""
    cfg = params.train
    device = distributed.rank_device(cfg.device, ddp)
    tokenizer = load_tokenizer(custody.take("tokenizer"))
    config = MiniGPTConfig.from_params(params.model, tokenizer.vocab_size)
    for split in ("train", "val"):
        custody.take(f"{split} ids")
    splits = {split: load_split(root / ENCODED_DIR, split) for split in ("train", "val")}
    for split, ids in splits.items():
        custody.used(f"{split} ids", ids)
    if params.uses_soft_targets():
        custody.take("soft targets")
    for split, ids in splits.items():
        if ids.numel() < config.block_size + 1:
            raise DataError(f"{root / ENCODED_DIR / split}.npy: {ids.numel()} tokens, fewer than one window of "
                            f"model.block_size + 1 = {config.block_size + 1}; use more text or a smaller block_size.")
    fingerprint = resume_fingerprint(params, tokenizer.fingerprint, root)
    code = code_fingerprint()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    model = model_factory(config).to(device)
    run = Run(params, root, ddp, device, say, tokenizer, splits["train"], splits["val"], model,
              train_step.ScheduledStep(model, cfg),
              torch.Generator().manual_seed(cfg.seed * 1000 + ddp.rank),  # different data on every rank
              {"resume_fingerprint": fingerprint, "code_fingerprint": code},
              average=WeightAverage(model, cfg.ema_decay) if cfg.ema_decay is not None else None,
              soft_targets=load_soft_targets(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)
              if params.uses_soft_targets() else None, custody=custody)
    if config.ngram_expert:
        custody.take("n-gram priors")
        run.val_priors = load_heldout_priors(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)["val"]
        if cfg.sample_length:
            run.next_token_ngram = load_next_token_ngram(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)
    checkpoint = find_resume_checkpoint(params, fingerprint, code, root, say)
    if checkpoint is not None:
        continue_from(run, checkpoint)
    run.model = torch.compile(model) if cfg.compile else model
    if ddp.world > 1:
        run.model = nn.parallel.DistributedDataParallel(run.model,
                                                        device_ids=[device.index] if device.type == "cuda" else None)
    run.scheduled_step.run_through(run.model)
    if ddp.main:
        run.log = RunLog(root / TRAIN_LOG, run.progress.history)
    run.resumed_from = checkpoint["step"] if checkpoint else None
    return run


def continue_from(run: Run, checkpoint: dict) -> None:
    if run.average is not None:
        # the resume fingerprint binds train.ema_decay, so a checkpoint of this run holds both sets of weights
        load_state_strict(run.average.model, checkpoint, checkpoint["path"])
        run.average.updates = checkpoint["average_updates"]
        load_state_strict(run.raw_model, {**checkpoint, "model_state_dict": checkpoint["trained_state_dict"]},
                          checkpoint["path"])
    else:
        load_state_strict(run.raw_model, checkpoint, checkpoint["path"])
    # load_state_dict moves the optimizer state to the parameters' device
    run.scheduled_step.optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    restore_rng(checkpoint["rng"])
    if len(checkpoint["batch_rng"]) != run.ddp.world:
        raise CheckpointError(f"{checkpoint['path']} was written by {len(checkpoint['batch_rng'])} process(es); "
                              f"resume it with the same number (now {run.ddp.world}).")
    run.batch_gen.set_state(checkpoint["batch_rng"][run.ddp.rank])
    history = []
    if run.ddp.main:
        history = history_for_resume(run.root / TRAIN_LOG, checkpoint["step"], checkpoint.get("log_sha256"))
        if history is None:
            run.say(f"[train] {TRAIN_LOG} does not hold the steps of {checkpoint['path']} (deleted, or written by "
                    f"another run); this run's log and curves start at step {checkpoint['step'] + 1}")
            history = []
    run.progress = Progress(checkpoint["step"], checkpoint["best_val_loss"], checkpoint["best_step"],
                            checkpoint["elapsed_s"], checkpoint["clipped_steps"], history)
    run.say(f"[train] resuming from {checkpoint['path']} at step {checkpoint['step']}")
    verify_restored(run, checkpoint)
