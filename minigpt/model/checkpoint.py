"""Checkpoints: written atomically, loaded with weights_only=True, refused loudly when they do not fit.

The keys are the guide's and PyTorch's: `model_state_dict`, `config` (MiniGPTConfig's fields, so
`MiniGPTConfig(**ckpt["config"])` rebuilds the model), `optimizer_state_dict` and `step`, beside minigpt's own
(`tokenizer_fingerprint`, the resume and code fingerprints, RNG states). Checkpoints written before this layout
(`model_state` / `model_config` / `optimizer_state`, with the loss history inside) are converted on load.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch
from pydantic import ValidationError

from minigpt.core.errors import MinigptError, WriteFailed
from minigpt.core.io_utils import atomic_write_bytes
from minigpt.data.tokenizer_files import Tokenizer, load_tokenizer
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.model.pickle_scan import pickled_globals

# keys of the layout minigpt wrote before it used the conventional names (renamed on load)
LEGACY_KEYS = {"model_state": "model_state_dict", "model_config": "config", "optimizer_state": "optimizer_state_dict"}


class CheckpointError(MinigptError):
    """A checkpoint is missing, unreadable, or does not fit the model/tokenizer it is loaded into."""


def save_checkpoint(path: str | Path, model: MiniGPT, tokenizer_fingerprint: str, **extra: Any) -> None:
    """Model state + its config + the tokenizer fingerprint (+ extra fields), via temp file, fsync, os.replace."""
    payload = {
        "model_state_dict": model.state_dict(),
        "config": model.config.model_dump(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        **extra,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)  # in memory first: torch's writer turns a full disk into a vague RuntimeError
    try:
        atomic_write_bytes(path, buffer.getbuffer())
    except (WriteFailed, OSError) as exc:
        cause = exc.cause if isinstance(exc, WriteFailed) else exc.strerror or exc
        raise CheckpointError(f"{path}: could not write the checkpoint ({cause}); the previous one is "
                              f"left as it was. Free disk space or fix the folder's permissions, then rerun to "
                              "resume.") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; train a model first (dvc repro train) or fix the path.")
    try:
        # weights_only: tensors and plain containers only, never arbitrary unpickled objects
        with warnings.catch_warnings():  # a plain pickle.dump file: torch warns of its protocol, then refuses it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        found = pickled_globals(path)
        if not found:
            raise CheckpointError(f"{path}: not a loadable checkpoint (the file is damaged or is not a "
                                  "checkpoint).") from None
        # torch's own message ends by suggesting weights_only=False: never relay that advice
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise CheckpointError(f"{path}: not a minigpt checkpoint: it holds pickled Python objects ({shown}), which "
                              "minigpt never writes and never loads (loading them could run code). Use a checkpoint "
                              "written by minigpt.") from None
    except Exception as exc:  # torch raises many types for a bad file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{path}: not a loadable checkpoint ({type(exc).__name__}: {first_line}); "
                              "the file is damaged or is not a checkpoint.") from None
    payload = upgrade_legacy_layout(payload)
    validate_payload(payload, path)
    return payload


def upgrade_legacy_layout(payload: Any) -> Any:
    """A checkpoint in the old layout, with the conventional key names (and without its copy of the loss log)."""
    if not isinstance(payload, dict) or not all(key in payload for key in ("model_state", "model_config")):
        return payload
    upgraded = {LEGACY_KEYS.get(key, key): value for key, value in payload.items() if key != "history"}
    upgraded["upgraded_from_legacy_layout"] = True
    return upgraded


def validate_payload(payload: Any, path: Path) -> None:
    """The shape minigpt writes: a dict with a state dict of tensors, a config dict and a fingerprint string."""
    def refuse(what: str) -> None:
        raise CheckpointError(f"{path}: not a minigpt checkpoint ({what}); use a checkpoint written by minigpt.")

    if not isinstance(payload, dict):
        refuse(f"it holds a {type(payload).__name__}, not a dictionary of fields")
    for key in ("model_state_dict", "config", "tokenizer_fingerprint"):
        if key not in payload:
            refuse(f"it lacks '{key}'")
    state = payload["model_state_dict"]
    if not isinstance(state, dict):
        refuse(f"'model_state_dict' is a {type(state).__name__}, not a state dict")
    odd = [k for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if odd:
        refuse(f"'model_state_dict' holds non-tensor entries: {', '.join(map(str, odd[:5]))}")
    if not isinstance(payload["config"], dict):
        refuse("'config' is not a dictionary")
    if not isinstance(payload["tokenizer_fingerprint"], str):
        refuse("'tokenizer_fingerprint' is not a string")


def config_differences(expected: MiniGPTConfig, found: dict) -> list[str]:
    return [
        f"{name}: model {value} vs checkpoint {found.get(name)}"
        for name, value in expected.model_dump().items()
        if found.get(name) != value
    ]


def load_state_strict(model: MiniGPT, checkpoint: dict, source: str | os.PathLike = "checkpoint") -> None:
    """Load every tensor or fail with the missing/unexpected keys, size mismatches and differing config fields."""
    state = checkpoint["model_state_dict"]
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or mismatched:
        lines = [f"{source}: checkpoint does not fit this model architecture."]
        diffs = config_differences(model.config, checkpoint.get("config", {}))
        if diffs:
            lines.append("differing config fields: " + "; ".join(diffs))
        if missing:
            lines.append(f"missing keys ({len(missing)}): " + ", ".join(missing[:12]))
        if unexpected:
            lines.append(f"unexpected keys ({len(unexpected)}): " + ", ".join(unexpected[:12]))
        if mismatched:
            lines.append(f"size mismatches ({len(mismatched)}): " + "; ".join(mismatched[:12]))
        lines.append("Build the model from the checkpoint's own config (model_from_checkpoint), or retrain.")
        raise CheckpointError("\n  ".join(lines))
    model.load_state_dict(state, strict=True)


def model_from_checkpoint(checkpoint: dict, device: str | torch.device = "cpu", source: str = "checkpoint") -> MiniGPT:
    """A model built from the checkpoint's own config, strictly loaded."""
    try:
        config = MiniGPTConfig(**checkpoint["config"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "config"
        raise CheckpointError(f"{source}: invalid config: {where}: {first['msg']} (got {first['input']!r}); "
                              "the checkpoint was not written for a minigpt model.") from None
    model = MiniGPT(config)
    load_state_strict(model, checkpoint, source)
    return model.to(device)


def require_tokenizer(checkpoint: dict, fingerprint: str, source: str = "checkpoint") -> None:
    if checkpoint["tokenizer_fingerprint"] != fingerprint:
        raise CheckpointError(
            f"{source}: trained with tokenizer {checkpoint['tokenizer_fingerprint'][:16]}…, but "
            f"data/tokenizer/tokenizer.json is {fingerprint[:16]}…; IDs would map to the wrong characters. "
            "Use the tokenizer the checkpoint was trained with, or retrain on the current data."
        )


class TrainedModel(NamedTuple):
    model: MiniGPT
    tokenizer: Tokenizer
    checkpoint: dict  # the rest of the payload (step, best_step, elapsed_s, ...)


def load_trained_model(path: str | Path, tokenizer_file: str | Path,
                       device: str | torch.device = "cpu") -> TrainedModel:
    """A checkpoint's model on `device` and the tokenizer it was trained with: refused when the tokenizer file is
    another one than the checkpoint's (what evaluate, generate and the doctor all load)."""
    checkpoint = load_checkpoint(path)
    tokenizer = load_tokenizer(tokenizer_file)
    require_tokenizer(checkpoint, tokenizer.fingerprint, str(path))
    return TrainedModel(model_from_checkpoint(checkpoint, device, str(path)), tokenizer, checkpoint)
