"""What a run needs to continue bit for bit: which checkpoint to resume (and why not), and the RNG states."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from minigpt.core.code_binding import changed_files, name_files
from minigpt.core.config import Params
from minigpt.core.io_utils import canonical_json_digest
from minigpt.core.paths import ENCODED_DIR, LATEST_CHECKPOINT
from minigpt.data.encode import split_hashes
from minigpt.model.checkpoint import CheckpointError, load_checkpoint

# train.* keys that may differ between a checkpoint and the run resuming it (they do not change the weights)
RESUME_FREE_KEYS = ("device", "compile", "resume_from")


def resume_fingerprint(params: Params, tokenizer_fp: str, root: Path) -> str:
    train = {k: v for k, v in params.section_dict("train").items() if k not in RESUME_FREE_KEYS}
    data = split_hashes(root / ENCODED_DIR, ("train", "val"))
    bound = {"model": params.section_dict("model"), "train": train, "tokenizer": tokenizer_fp, "data": data}
    if params.uses_soft_targets():  # the targets' recipe (their data is train's, bound above), discount included
        bound["soft_targets"] = {**params.section_dict("soft_targets"), "discount": params.baselines.discount}
    return canonical_json_digest(bound)


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "numpy": _numpy_state(), "python": _python_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _numpy_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss,
            "cached": cached}


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
    path = Path(explicit) if explicit else root / LATEST_CHECKPOINT
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
        out(f"[train] not resuming: {path} was written by other code (changed: {name_files(changed)}); starting "
            f"from step 0. To continue it across the change on purpose, set train.resume_from={path}")
        return None
    if changed:
        out(f"[train] train.resume_from: continuing {path} across a code change (changed: {name_files(changed)})")
    if checkpoint["step"] >= params.train.max_steps:
        if explicit:
            raise CheckpointError(f"train.resume_from: {path} is already at step {checkpoint['step']} of "
                                  f"train.max_steps = {params.train.max_steps}; there is nothing left to train.")
        out(f"[train] {path} already finished this exact run (same data, settings and code) at step "
            f"{checkpoint['step']}; nothing left to train. Delete it to train again.")
    checkpoint["path"] = str(path)
    return checkpoint
