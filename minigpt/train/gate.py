"""The debug report's binding and the training gate.

A report is bound to the encoded arrays, the tokenizer, the gated configuration and the run's code (the files
of minigpt.core.code_binding). Training refuses to start unless the report passed and every binding still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minigpt.core.code_binding import changed_files, code_fingerprint, name_files
from minigpt.core.config import Params
from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import canonical_json_digest, read_json, sha256_file
from minigpt.core.paths import DEBUG_REPORT, ENCODED_DIR, SOFT_TARGETS_DIR, SPLITS, TOKENIZER_FILE
from minigpt.data.encode import split_hashes
from minigpt.data.soft_target_files import ARRAYS_NAME
from minigpt.data.tokenizer_files import load_tokenizer

# train.* keys whose value changes what preflight proves (the gate refuses a report made with other values):
# the rehearsal runs the run's optimizer, schedule (over max_steps, down to min_lr), clipping and precision;
# precision auto is timed at the run's batch size, and budget.choose_shape picks from the tokens in max_seconds
GATED_TRAIN_KEYS = ("lr", "min_lr", "max_steps", "warmup_steps", "weight_decay", "betas", "grad_clip", "device",
                    "precision", "batch_size", "max_seconds", "optimizer", "distill_alpha")
# whole sections the report binds (with GATED_TRAIN_KEYS); dvc.yaml's preflight params list the same
GATED_SECTIONS = ("model", "preflight", "budget", "soft_targets")


class PreflightFailed(MinigptError):
    """A preflight check failed: the report was written and names it."""


class GateError(MinigptError):
    """Training refused: the debug report is missing, failed, edited, or made for other data/config/code."""


def gated_config(params: Params) -> dict:
    config = {name: params.section_dict(name) for name in GATED_SECTIONS}
    config["train"] = {k: params.section_dict("train")[k] for k in GATED_TRAIN_KEYS}
    return config


def current_fingerprints(params: Params, root: Path = Path(".")) -> dict:
    """What a report is bound to: the encoded arrays' SHA-256, the tokenizer fingerprint, the gated config, the
    run's code, and the soft targets' SHA-256 when the run trains on them (else None)."""
    encoded = split_hashes(root / ENCODED_DIR)
    try:
        tokenizer = load_tokenizer(root / TOKENIZER_FILE).fingerprint
    except MinigptError:
        tokenizer = None
    targets = root / SOFT_TARGETS_DIR / ARRAYS_NAME
    soft = sha256_file(targets) if params.train.distill_alpha > 0 and targets.is_file() else None
    return {"encoded": encoded, "tokenizer": tokenizer, "config": canonical_json_digest(gated_config(params)),
            "code": code_fingerprint(), "soft_targets": soft}


def run_params(params: Params, report: dict, path: Path = Path(DEBUG_REPORT)) -> Params:
    """The params the gated run uses: budget.choose_shape and train.precision auto resolved to the choices the
    report made (and binds)."""
    if params.budget.choose_shape:
        shape = (report.get("shape") or {}).get("choice")
        if shape not in params.budget.shapes:
            raise GateError(f"{path}: budget.choose_shape is true but the report holds no choice among "
                            f"{', '.join(params.budget.shapes)}; rerun preflight (`dvc repro preflight`) to time the "
                            "shapes on this machine.")
        params = params.with_shape(shape)
    if params.train.precision != "auto":
        return params
    choice = (report.get("precision") or {}).get("choice")
    if choice not in ("fp32", "bf16"):
        raise GateError(f"{path}: train.precision is auto but the report holds no precision choice; rerun preflight "
                        "(`dvc repro preflight`) to time fp32 and bf16 on this machine.")
    return params.with_train_precision(choice)


@dataclass(frozen=True)
class GatePassed:
    report: dict  # the debug report that passed
    params: Params  # the params the run trains with: the shape and precision the report chose (run_params)


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
    params = run_params(params, report, path)
    now = current_fingerprints(params, root)
    then = report.get("fingerprints") or {}
    stale = [f"encoded {s}" for s in SPLITS if (then.get("encoded") or {}).get(s) != now["encoded"][s]]
    if then.get("tokenizer") != now["tokenizer"]:
        stale.append("tokenizer")
    if then.get("soft_targets") != now["soft_targets"]:
        stale.append("soft targets")
    if then.get("config") != now["config"]:
        old = report.get("config") or {}
        new = gated_config(params)
        changed = [f"{sec}.{k}" for sec in new for k in new[sec] if (old.get(sec) or {}).get(k) != new[sec][k]]
        stale.append("config (" + (", ".join(changed) or "changed") + ")")
    if (then.get("code") or {}).get("digest") != now["code"]["digest"]:
        stale.append("code (" + (name_files(changed_files(then.get("code"), now["code"])) or "changed") + ")")
    if stale:
        raise GateError(f"{path}: the report was made for other inputs; mismatched fingerprint: {'; '.join(stale)}. "
                        f"{refresh}")
    return GatePassed(report, params)
