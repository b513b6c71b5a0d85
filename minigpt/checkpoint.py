"""Checkpoints: written atomically, loaded with weights_only=True, refused loudly when they do not fit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from minigpt.errors import MinigptError
from minigpt.io_utils import atomic_path
from minigpt.model import MiniGPT, MiniGPTConfig


class CheckpointError(MinigptError):
    """A checkpoint is missing, unreadable, or does not fit the model/tokenizer it is loaded into."""


def save_checkpoint(path: str | Path, model: MiniGPT, tokenizer_fingerprint: str, **extra: Any) -> None:
    """Model state + its config + the tokenizer fingerprint (+ extra fields), via temp file, fsync, os.replace."""
    payload = {
        "model_state": model.state_dict(),
        "model_config": model.config.to_dict(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        **extra,
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; train a model first (dvc repro train) or fix the path.")
    try:
        # weights_only: tensors and plain containers only, never arbitrary unpickled objects
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise CheckpointError(f"{path}: not a loadable checkpoint ({type(exc).__name__}: {exc}).") from None
    for key in ("model_state", "model_config", "tokenizer_fingerprint"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint lacks '{key}'; it was not written by minigpt.")
    return payload


def config_differences(expected: MiniGPTConfig, found: dict) -> list[str]:
    return [
        f"{name}: model {value} vs checkpoint {found.get(name)}"
        for name, value in expected.to_dict().items()
        if found.get(name) != value
    ]


def load_state_strict(model: MiniGPT, checkpoint: dict, source: str | os.PathLike = "checkpoint") -> None:
    """Load every tensor or fail with the missing/unexpected keys, size mismatches and differing config fields."""
    state = checkpoint["model_state"]
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
        diffs = config_differences(model.config, checkpoint.get("model_config", {}))
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
        config = MiniGPTConfig.from_dict(checkpoint["model_config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: invalid model_config ({exc}).") from None
    model = MiniGPT(config)
    load_state_strict(model, checkpoint, source)
    return model.to(device)


def require_tokenizer(checkpoint: dict, fingerprint: str, source: str = "checkpoint") -> None:
    if checkpoint["tokenizer_fingerprint"] != fingerprint:
        raise CheckpointError(
            f"{source}: trained with tokenizer {checkpoint['tokenizer_fingerprint'][:16]}…, but "
            f"data/tokenizer/char_tokenizer.json is {fingerprint[:16]}…; IDs would map to the wrong characters. "
            "Use the tokenizer the checkpoint was trained with, or retrain on the current data."
        )
