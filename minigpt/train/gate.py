"""The debug report's binding and the training gate.

A report is bound to the encoded arrays, the tokenizer, the gated configuration and the run's code (the files
of minigpt.core.code_binding). Training refuses to start unless the report passed and every binding still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minigpt.core.code_binding import changed_files, code_fingerprint, name_files
from minigpt.core.config import MachineConfig, Params
from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import canonical_json_digest, read_json, sha256_file
from minigpt.core.paths import DEBUG_REPORT, ENCODED_DIR, SOFT_TARGETS_DIR, SPLITS, TOKENIZER_FILE
from minigpt.core.provenance import NGRAM_PRIORS_FILE
from minigpt.data.encode import split_hashes
from minigpt.data.soft_target_files import ARRAYS_NAME
from minigpt.data.tokenizer_files import load_tokenizer
from minigpt.train.machine_choice import verify_machine_choice

# train.* keys whose value changes what preflight proves (the gate refuses a report made with other values):
# the rehearsal runs the run's optimizer, schedule (over max_steps, down to min_lr), clipping and precision,
# and a machine choice was timed at the run's batch size and chosen by the tokens in max_seconds
GATED_TRAIN_KEYS = ("lr", "min_lr", "max_steps", "warmup_steps", "weight_decay", "betas", "grad_clip", "device",
                    "precision", "batch_size", "max_seconds", "optimizer", "distill_alpha")
# whole sections the report binds (with GATED_TRAIN_KEYS); dvc.yaml's preflight params list the same
# (shape: the budget shape composed in; machine: where the machine-dependent values came from)
GATED_SECTIONS = ("model", "preflight", "budget", "soft_targets", "shape", "machine")


class PreflightFailed(MinigptError):
    """A preflight check failed: the report was written and names it."""


class GateError(MinigptError):
    """Training refused: the debug report is missing, failed, edited, or made for other data/config/code."""


def _plain(value):
    return value.model_dump() if hasattr(value, "model_dump") else value


def gated_config(params: Params) -> dict:
    config = {name: _plain(getattr(params, name)) for name in GATED_SECTIONS}
    config["train"] = {k: params.section_dict("train")[k] for k in GATED_TRAIN_KEYS}
    return config


def current_fingerprints(params: Params, root: Path = Path(".")) -> dict:
    """What a report is bound to: the encoded arrays' SHA-256, the tokenizer fingerprint, the gated config, the
    run's code, and the soft targets' SHA-256 when the run reads them (else None), with the val and test priors'
    under model.ngram_expert."""
    encoded = split_hashes(root / ENCODED_DIR)
    try:
        tokenizer = load_tokenizer(root / TOKENIZER_FILE).fingerprint
    except MinigptError:
        tokenizer = None
    targets = root / SOFT_TARGETS_DIR / ARRAYS_NAME
    priors = root / NGRAM_PRIORS_FILE
    soft = sha256_file(targets) if params.uses_soft_targets() and targets.is_file() else None
    heldout = sha256_file(priors) if params.model.ngram_expert and priors.is_file() else None
    return {"encoded": encoded, "tokenizer": tokenizer, "config": canonical_json_digest(gated_config(params)),
            "code": code_fingerprint(), "soft_targets": soft, "ngram_priors": heldout}


def _changed_keys(section: str, old, new) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [f"{section}.{k}" for k in new if old.get(k) != new[k]]
    return [section] if old != new else []


@dataclass(frozen=True)
class GatePassed:
    report: dict  # the debug report that passed
    params: Params  # the params the run trains with (exactly params.yaml's)
    machine: MachineConfig | None  # the machine's measured choice it uses, proven to be this machine's


def verify_gate(params: Params, root: Path = Path("."), report_path: Path | None = None) -> GatePassed:
    """Refuse training unless the report passed and is bound to exactly the current data, configuration and code;
    what passed is the report and the params it resolves for the run."""
    path = report_path or root / DEBUG_REPORT
    refresh = "Run `dvc repro preflight` (or `python stages/preflight.py`) to refresh it."
    report = read_json(path, missing="no debug report; training starts only after preflight passes",
                       invalid="unreadable debug report", fix=refresh, error=GateError)
    if not isinstance(report, dict):
        raise GateError(f"{path}: not a debug report (a JSON object was expected, found {type(report).__name__}). "
                        f"{refresh}")
    body = {k: v for k, v in report.items() if k != "report_digest"}
    if report.get("report_digest") != canonical_json_digest(body):
        raise GateError(f"{path}: the report does not match its digest: it was edited by hand. {refresh}")
    if not report.get("passed"):
        raise GateError(f"{path}: preflight failed ({', '.join(report.get('failed') or ['?'])}); fix that, then rerun "
                        f"preflight. {refresh}")
    machine = verify_machine_choice(params)
    now = current_fingerprints(params, root)
    then = report.get("fingerprints") or {}
    stale = [f"encoded {s}" for s in SPLITS if (then.get("encoded") or {}).get(s) != now["encoded"][s]]
    if then.get("tokenizer") != now["tokenizer"]:
        stale.append("tokenizer")
    if then.get("soft_targets") != now["soft_targets"]:
        stale.append("soft targets")
    if then.get("ngram_priors") != now["ngram_priors"]:
        stale.append("n-gram priors of val and test")
    if then.get("config") != now["config"]:
        old = report.get("config") or {}
        new = gated_config(params)
        changed = [name for sec in new for name in _changed_keys(sec, old.get(sec), new[sec])]
        stale.append("config (" + (", ".join(changed) or "changed") + ")")
    if (then.get("code") or {}).get("digest") != now["code"]["digest"]:
        stale.append("code (" + (name_files(changed_files(then.get("code"), now["code"])) or "changed") + ")")
    if stale:
        raise GateError(f"{path}: the report was made for other inputs; mismatched fingerprint: {'; '.join(stale)}. "
                        f"{refresh}")
    return GatePassed(report, params, machine)
