"""Preflight's resume check: resume is proven, not assumed. The real training loop (minigpt.train.loop.train) runs
the configured model, optimizer, precision, weight average and soft targets twice in a scratch folder over the same
data: once for RESUME_AT + MORE steps uninterrupted, once stopped after RESUME_AT steps (as Ctrl-C stops it: a
checkpoint, then exit) and resumed into fresh objects for the rest. The two final checkpoints must agree bit for
bit, part by part, and the resumed run must have verified what it restored against the checkpoint's fingerprints
(minigpt.train.run_state.verify_restored)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from minigpt.core import thread_share
from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, LATEST_CHECKPOINT, SOFT_TARGETS_DIR, TOKENIZER_FILE
from minigpt.model.checkpoint import load_checkpoint
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train.loop import train
from minigpt.train.run_control import TrainingStopped
from minigpt.train.state_digest import state_digest

RESUME_AT, MORE = 2, 2  # stopped after step 2 (the warmup, capped at 2 steps, is over), resumed for 2 more
# checkpoint key -> the part of the run it holds (elapsed_s is wall clock: it differs between any two runs)
COMPARED = {"model_state_dict": "weights evaluated", "trained_state_dict": "trained weights",
            "optimizer_state_dict": "optimizer state", "rng": "RNG streams", "batch_rng": "batch stream",
            "average_updates": "weight average updates", "step": "step", "best_step": "best step",
            "best_val_loss": "best val loss", "clipped_steps": "clipped steps"}


def resume_params(ctx: Context):
    """The run's params over RESUME_AT + MORE steps (evaluated and checkpointed after RESUME_AT), on the step
    counter alone (the clock is wall time: no two runs share it), at preflight's batch size."""
    train_cfg = ctx.params.train.model_copy(update={
        "max_steps": RESUME_AT + MORE, "warmup_steps": min(ctx.params.train.warmup_steps, 2),
        "eval_every": RESUME_AT, "eval_batches": 1, "sample_length": 0, "max_seconds": None, "resume_from": None,
        "compile": False, "batch_size": ctx.params.preflight.batch_size})
    return ctx.params.model_copy(update={"train": train_cfg})


def _scratch_project(root: Path, folder: Path) -> Path:
    """A folder whose data are links to the project's (the records inside them come along)."""
    for artifact in (ENCODED_DIR, TOKENIZER_FILE, SOFT_TARGETS_DIR):
        if (root / artifact).exists():
            (folder / artifact).parent.mkdir(parents=True, exist_ok=True)
            (folder / artifact).symlink_to((root / artifact).resolve())
    return folder


def check_resume(ctx: Context) -> dict:
    params = resume_params(ctx)
    quiet = lambda _message: None  # noqa: E731
    said: list[str] = []
    with tempfile.TemporaryDirectory(prefix="minigpt-resume-check-") as scratch:
        whole = _scratch_project(ctx.root, Path(scratch) / "whole")
        parted = _scratch_project(ctx.root, Path(scratch) / "parted")
        # one thread count for all three runs, however many minigpt processes start or end meanwhile
        with thread_share.held():
            try:
                train(params, whole, require_gate=False, model_factory=ctx.model_factory, out=quiet, curves_png=False)
                try:
                    train(params, parted, require_gate=False, model_factory=ctx.model_factory, out=quiet,
                          stop_at_step=RESUME_AT, curves_png=False)
                    raise CheckFailed(f"the run asked to stop after step {RESUME_AT} did not stop")
                except TrainingStopped:
                    pass
                train(params, parted, require_gate=False, model_factory=ctx.model_factory, out=said.append,
                      curves_png=False)
            except MinigptError as exc:
                raise CheckFailed(f"the interrupted run could not resume: {exc}", {"log": said[-4:]}) from None
        uninterrupted, resumed = (load_checkpoint(folder / LATEST_CHECKPOINT) for folder in (whole, parted))
    verified = [line for line in said if line.startswith("[train] resume verified")]
    measured = {"stopped_after": RESUME_AT, "steps": RESUME_AT + MORE, "batch_size": params.train.batch_size,
                "resumed_step": resumed.get("step"), "verified": verified[0] if verified else None,
                "parts": {}}
    differing = []
    for key, part in COMPARED.items():
        if key not in uninterrupted and key not in resumed:
            continue
        same = key in uninterrupted and key in resumed and state_digest(uninterrupted[key]) == state_digest(
            resumed[key])
        measured["parts"][part] = "equal" if same else "differ"
        if not same:
            differing.append(part)
    if not verified:
        raise CheckFailed("the second run did not resume from the interrupted run's checkpoint (no 'resume "
                          "verified' line): " + "; ".join(said[:3]), measured)
    if differing:
        raise CheckFailed(f"stopped after step {RESUME_AT} and resumed, the run ends step {RESUME_AT + MORE} with "
                          f"other {', '.join(differing)} than the same run uninterrupted: the resume does not "
                          "continue as if never interrupted", measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("resume", check_resume,
          ("optimizer_update", "lr_schedule", "soft_targets", "soft_targets_held_out", "soft_targets_aligned",
           "ngram_priors", "expert_gate_even"),
          lambda c: (f"the real loop, stopped after step {RESUME_AT} and resumed into fresh objects, ends step "
                     f"{RESUME_AT + MORE} bit for bit equal to the same run uninterrupted (weights, trained weights, "
                     "optimizer state, RNG streams, batch stream, weight average, step and best), and verified what "
                     "it restored against the checkpoint's fingerprints"),
          ("the restore forgets a part (optimizer state, an RNG stream, the batch sampler, the weight average)",
           "a checkpoint saved before the step's state was complete", "a resumed run that re-seeds its samplers")),
)
