"""Preflight: every check in the order the data flows (data -> model -> training), and the report it writes.

Each check isolates one assumption of the pipeline and either returns what it measured or raises CheckFailed
with the measurement, the threshold and the likely causes (the debugging guide's symptom -> cause map).
Checks whose prerequisites did not pass are reported as skipped, with the reason. The report is bound to the
data, config and code it checked (minigpt.train.gate), which train verifies before it starts.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from minigpt.core.config import Params
from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import atomic_write_json, canonical_json_digest
from minigpt.core.paths import DEBUG_REPORT, TOKENIZER_FILE
from minigpt.data.tokenizer_files import load_tokenizer
from minigpt.model.devices import select_device
from minigpt.model.gpt import MiniGPTConfig
from minigpt.preflight import (
    architecture_checks,
    data_checks,
    expert_checks,
    model_checks,
    resume_check,
    soft_target_checks,
    step_checks,
    training_checks,
    watchdog_check,
)
from minigpt.preflight.checks import Check, CheckResult, run_checks
from minigpt.preflight.context import Context
from minigpt.train.gate import current_fingerprints, gated_config
from minigpt.train.machine_choice import verify_machine_choice

SUMMARY_FIELDS = ("tokenizer_fingerprint", "vocab_size", "token_range", "batch_shape", "initial_loss",
                  "expected_initial_loss", "grad_norm", "missing_gradients", "frozen_parameters", "param_update_max",
                  "rehearsal_loss", "single_batch_final_loss")

# the debugging guide's three failure families: wrong computation (correctness), numbers that go bad
# (numerical), and a correct model that does not learn (optimisation)
FAMILIES = {
    "environment": "correctness", "files": "correctness", "tokenizer": "correctness", "token_ids": "correctness",
    "batch_shift": "correctness", "soft_targets": "correctness", "soft_targets_held_out": "correctness",
    "soft_targets_aligned": "correctness", "ngram_priors": "correctness", "expert_gate_even": "correctness",
    "forward_shapes": "correctness", "initial_loss": "numerical",
    "causal_independence": "correctness", "architecture": "correctness", "gradients": "numerical",
    "optimizer_update": "optimisation",
    "decay_split": "optimisation", "lr_schedule": "optimisation", "clipping_contract": "numerical",
    "weight_average": "correctness", "resume": "correctness", "watchdogs_fire": "correctness",
    "lr_stability": "optimisation", "rehearsal_learns": "optimisation", "single_batch_overfit": "optimisation",
}
CHECKS: tuple[Check, ...] = tuple(
    replace(check, family=FAMILIES[check.name])
    for check in (data_checks.CHECKS + soft_target_checks.CHECKS + model_checks.CHECKS + expert_checks.CHECKS
                  + architecture_checks.CHECKS
                  + step_checks.CHECKS + resume_check.CHECKS + watchdog_check.CHECKS + training_checks.CHECKS))


def time_spent(results: list[CheckResult], preflight_seconds: float) -> dict:
    """Where preflight's time went: the checks (and without the overfit check) and the whole stage's wall clock from
    its start to the report (preflight times nothing: the machine's choices are measured by `make machine`)."""
    total = sum(r.seconds for r in results)
    overfit_seconds = sum(r.seconds for r in results if r.name == "single_batch_overfit")
    return {"total": round(total, 3), "without_overfit": round(total - overfit_seconds, 3),
            "preflight": round(preflight_seconds, 3)}


def build_report(ctx: Context, results: list[CheckResult], fingerprints: dict, machine: dict | None,
                 seconds: dict) -> dict:
    env = next((r.measured for r in results if r.name == "environment"), {})
    report = {
        "passed": all(r.status == "passed" for r in results),
        "failed": [r.name for r in results if r.status == "failed"],
        "skipped": [r.name for r in results if r.status == "skipped"],
        "checks": [r.to_dict() for r in results],
        **{name: ctx.summary.get(name) for name in SUMMARY_FIELDS},
        "environment": env,
        # "total": the checks' seconds; "preflight": the stage's wall clock
        "seconds": seconds,
        "config": gated_config(ctx.params),
        # the machine's measured choice the run uses (conf/machine/, proven to be this machine's), or null
        "machine": machine,
        "fingerprints": fingerprints,
    }
    report["report_digest"] = canonical_json_digest(report)
    return report


def discard_report(path: Path) -> None:
    """Remove a previous report before any check runs: no path (a crash, Ctrl-C) can leave an old one standing."""
    path.unlink(missing_ok=True)


def run_preflight(params: Params, root: Path = Path("."), report_path: Path | None = None, **context_overrides) -> dict:
    """Run every check on the real artifacts under root, write the report atomically, return it."""
    started = time.perf_counter()
    report_path = report_path or root / DEBUG_REPORT
    discard_report(report_path)
    # the values this machine chose (train.precision, a budget shape) are in params; refuse them if made elsewhere
    machine = verify_machine_choice(params)
    device = select_device(params.train.device)
    tokenizer_vocab = None
    try:
        tokenizer_vocab = load_tokenizer(root / TOKENIZER_FILE).vocab_size
    except MinigptError:
        pass
    # bound before the checks run: the report vouches for the data, config and code that were checked
    fingerprints = current_fingerprints(params, root)
    model_config = MiniGPTConfig.from_params(params.model, tokenizer_vocab or 1)
    ctx = Context(params=params, root=root, device=device, model_config=model_config, **context_overrides)
    torch.manual_seed(params.preflight.seed)
    results = run_checks(ctx, CHECKS)
    seconds = time_spent(results, time.perf_counter() - started)
    report = build_report(ctx, results, fingerprints, machine and machine.model_dump(), seconds)
    atomic_write_json(report_path, report)
    return report
