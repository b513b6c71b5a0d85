"""Stage `soft_targets`: data/soft_targets/ holds targets.npz (per train position, the top token IDs and their
probabilities, fp16) and summary.json (how they were built, from which encoded train, and how good they are).
Training and preflight load them through load_soft_targets, which refuses targets built for other data."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_directory, atomic_write_json, read_json
from minigpt.core.provenance import Custody
from minigpt.data.encode import load_ids, load_meta
from minigpt.data.soft_targets import crossfit_soft_targets
from minigpt.data.tokenizer import ids_dtype

ARRAYS_NAME = "targets.npz"
SUMMARY_NAME = "summary.json"
FIX = "run `dvc repro soft_targets` (or `dvc repro`)"


def build_soft_targets(encoded_dir: str | Path, out_dir: str | Path, order: int, top: int, folds: int,
                       discount: float, custody: Custody | None = None) -> dict:
    """Write out_dir (atomically, as a whole directory) from encoded train; return the summary. Order 0 writes
    the summary alone (no targets). `custody` (the stage's record) checks encoded train and records what was used."""
    meta = load_meta(encoded_dir)
    vocab = int(meta["vocab_size"])
    summary = {"order": order, "top": min(top, vocab), "folds": folds, "discount": discount, "vocab_size": vocab,
               "train_sha256": meta["splits"]["train"]["sha256"]}
    with atomic_directory(out_dir) as tmp:
        if order > 0:
            if custody is not None:
                custody.take("train ids")
            train = np.asarray(load_ids(encoded_dir, "train"), dtype=np.int64)
            if custody is not None:
                custody.used("train ids", train)
            if len(train) <= folds:
                raise DataError(f"{encoded_dir}: train has {len(train)} tokens, too few for {folds} folds "
                                "(soft_targets.folds); lower it or use more data.")
            started = time.perf_counter()
            ids, probs, bits, kept = crossfit_soft_targets(train, vocab, order, folds, top, discount)
            with open(tmp / ARRAYS_NAME, "wb") as handle:
                np.savez(handle, ids=ids.astype(ids_dtype(vocab)), probs=probs.astype(np.float16))
            summary.update(positions=len(train), seconds=round(time.perf_counter() - started, 2),
                           # every position but the first, which has no context
                           bits_per_token=float(bits[1:].mean()), kept_mass=float(kept[1:].mean()))
        atomic_write_json(tmp / SUMMARY_NAME, summary)
    return summary


@dataclass(frozen=True)
class SoftTargets:
    """The targets of every train position: ids [N, top] (uint8, or int32 for a vocabulary past 256), probs [N, top]
    (fp16)."""
    ids: torch.Tensor
    probs: torch.Tensor
    summary: dict

    def at(self, positions: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(ids long, probs float32), each [*positions.shape, top], on `device`."""
        return (self.ids[positions].to(device, dtype=torch.long),
                self.probs[positions].to(device, dtype=torch.float32))

    def for_targets(self, starts: torch.Tensor, block_size: int, device: torch.device | str = "cpu"):
        """The targets of the windows get_batch drew at `starts`: targets[:, t] is train[starts + t + 1], so
        its soft target is the distribution at that position."""
        return self.at(starts[:, None] + 1 + torch.arange(block_size), device)


def load_soft_targets(folder: str | Path, encoded_dir: str | Path) -> SoftTargets:
    """The soft targets, refused unless they were built from exactly this encoded train (never unpickled)."""
    folder = Path(folder)
    summary = read_json(folder / SUMMARY_NAME, missing="not found", invalid="not valid JSON", fix=FIX + ".",
                        error=DataError)
    meta = load_meta(encoded_dir)
    if not isinstance(summary, dict) or summary.get("train_sha256") != meta["splits"]["train"]["sha256"]:
        raise DataError(f"{folder / SUMMARY_NAME}: built from another encoded train than {encoded_dir} (the "
                        f"tokenizer or the data changed since); {FIX}.")
    if not summary.get("order"):
        raise DataError(f"{folder / SUMMARY_NAME}: no soft targets were built (soft_targets.order 0); set "
                        f"soft_targets.order, then {FIX}.")
    path = folder / ARRAYS_NAME
    try:
        with np.load(path, allow_pickle=False) as arrays:
            ids, probs = arrays["ids"], arrays["probs"]
    except FileNotFoundError:
        raise DataError(f"{path}: not found; {FIX}.") from None
    except (ValueError, KeyError, OSError) as exc:
        raise DataError(f"{path}: not a soft-targets archive ({exc}); {FIX}.") from None
    positions, top = meta["splits"]["train"]["length"], summary["top"]
    if ids.shape != (positions, top) or probs.shape != (positions, top):
        raise DataError(f"{path}: arrays of shape {ids.shape} / {probs.shape}, expected ({positions}, {top}) "
                        f"(train positions, soft_targets.top); {FIX}.")
    return SoftTargets(torch.from_numpy(ids if ids.dtype == np.uint8 else ids.astype(np.int32)),
                       torch.from_numpy(probs), summary)
