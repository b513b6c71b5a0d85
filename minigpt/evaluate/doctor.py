"""Diagnose a trained checkpoint: strict load, tokenizer fingerprint, and the checks that apply to trained weights.

    python -m minigpt.evaluate.doctor --checkpoint models/mini_gpt_best.pt      (or the console script: minigpt-doctor)
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

from minigpt.core.config import DEFAULT_PARAMS, load_params
from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR, TOKENIZER_FILE
from minigpt.data.soft_target_files import (
    load_heldout_priors,
    load_soft_targets,
    load_soft_targets_summary,
    require_trained_ngram,
)
from minigpt.model.batch_loss import evaluate_model, fixed_val_batches
from minigpt.model.checkpoint import load_trained_model
from minigpt.model.devices import select_device
from minigpt.preflight.checks import Check, CheckFailed, format_table, run_checks
from minigpt.preflight.context import Context
from minigpt.preflight.suite import CHECKS

DOCTOR_BATCHES = 8
# trained weights must beat the uniform baseline log(V) by at least this much (nats/char)
TRAINED_MARGIN = 0.5
# the preflight checks that make sense for trained weights (initial_loss and training from scratch do not)
APPLICABLE = ("environment", "files", "tokenizer", "token_ids", "batch_shift", "forward_shapes",
              "causal_independence", "gradients")


def check_trained_loss(ctx: Context) -> dict:
    val_priors = None
    if ctx.model_config.ngram_expert:  # the loss of what the model predicts: its mixture with the n-gram
        val_priors = load_heldout_priors(ctx.path(SOFT_TARGETS_DIR), ctx.path(ENCODED_DIR))["val"]
    batches = fixed_val_batches(ctx.splits["val"], DOCTOR_BATCHES, ctx.params.preflight.batch_size,
                                ctx.model_config.block_size, ctx.params.preflight.seed, ctx.device, val_priors)
    loss = evaluate_model(ctx.model, batches)
    baseline = math.log(ctx.model_config.vocab_size)
    measured = {"val_loss": loss, "log_v": baseline, "margin": TRAINED_MARGIN, "batches": DOCTOR_BATCHES}
    if not loss < baseline - TRAINED_MARGIN:
        raise CheckFailed(
            f"validation loss {loss:.4f} is not clearly below the random baseline log(V) = {baseline:.4f}: "
            "the weights were not loaded/trained, or the tokenizer does not match the checkpoint",
            measured,
        )
    return measured


TRAINED_LOSS = Check("trained_loss", check_trained_loss, ("forward_shapes",),
                     f"val loss < log(V) - {TRAINED_MARGIN}",
                     ("weights not loaded (fresh init)", "tokenizer differs from the one used in training",
                      "checkpoint from a run that diverged"))


def diagnose(checkpoint_path: Path, params_path: Path = Path(DEFAULT_PARAMS), root: Path = Path(".")) -> list[dict]:
    params = load_params(params_path)
    device = select_device(params.train.device)
    trained = load_trained_model(checkpoint_path, root / TOKENIZER_FILE, device)
    model = trained.model
    ctx = Context(params=params, root=root, device=device, model_config=model.config,
                  model_factory=lambda _config: copy.deepcopy(model))
    if model.config.ngram_expert:  # the checks run the model with the n-gram it was trained with
        folder, encoded = root / SOFT_TARGETS_DIR, root / ENCODED_DIR
        require_trained_ngram(trained.checkpoint, load_soft_targets_summary(folder, encoded), str(checkpoint_path))
        ctx.soft_targets = load_soft_targets(folder, encoded)
    checks = tuple(c for c in CHECKS if c.name in APPLICABLE) + (TRAINED_LOSS,)
    return [r.to_dict() for r in run_checks(ctx, checks)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minigpt-doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--params", default=DEFAULT_PARAMS, type=Path)
    parser.add_argument("--root", default=Path("."), type=Path, help="project root holding data/ (default: .)")
    args = parser.parse_args(argv)
    try:
        results = diagnose(args.checkpoint, args.params, args.root)
    except MinigptError as exc:
        print(f"[doctor] error: {exc}", file=sys.stderr)
        return 1
    print(format_table(results))
    failed = [r["name"] for r in results if r["status"] != "passed"]
    if failed:
        print(f"[doctor] {args.checkpoint}: not healthy ({', '.join(failed)})", file=sys.stderr)
        return 1
    print(f"[doctor] {args.checkpoint}: all checks passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
