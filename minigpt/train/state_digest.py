"""Fingerprints of a run's resumable state, part by part: what a checkpoint records when it is written, and what the
resumed run recomputes from its own freshly restored objects, so a resume that restores a part wrongly (or not at
all) is named before the first step.

A digest walks nested dicts, lists and tuples in order; a tensor counts by dtype, shape and bytes; anything else by
its repr. Floats therefore compare exactly, as a bit-for-bit resume needs."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _feed(digest, obj) -> None:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(obj, np.ndarray):
        digest.update(f"N{obj.dtype}{obj.shape}".encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        digest.update(b"{")
        for key in obj:  # insertion order: state dicts are ordered
            digest.update(repr(key).encode() + b":")
            _feed(digest, obj[key])
        digest.update(b"}")
    elif isinstance(obj, (list, tuple)):
        digest.update(b"[")
        for item in obj:
            _feed(digest, item)
        digest.update(b"]")
    else:
        digest.update(repr(obj).encode())


def state_digest(obj) -> str:
    digest = hashlib.sha256()
    _feed(digest, obj)
    return digest.hexdigest()


def part_digests(trained_state: dict, optimizer_state: dict, average_state: dict | None, position: dict,
                 rng: dict) -> dict[str, str]:
    """The digest of every resumable part but the batch stream (one per rank: the caller adds it); the weight
    average's only when the run keeps one."""
    parts = {"model": trained_state, "optimizer": optimizer_state, "weight average": average_state,
             "schedule position": position, "RNG streams": rng}
    return {name: state_digest(value) for name, value in parts.items() if value is not None}
