"""Stage `soft_targets`: data/soft_targets/ holds targets.npz (per train position, the top token IDs and their
probabilities, fp16, and the mass outside them, fp32), priors.npz (the same for every val and test position, from
the n-gram counted on all of train: what model.ngram_expert mixes in there) and summary.json (how they were built,
from which encoded splits, and how good they are). Training, evaluation and preflight load them through
load_soft_targets / load_heldout_priors, which refuse targets built for other data."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_directory, atomic_write_json, read_json
from minigpt.core.provenance import Custody
from minigpt.data.encode import load_ids, load_meta
from minigpt.data.soft_targets import count_ngrams, crossfit_soft_targets, heldout_topk
from minigpt.data.tokenizer import ids_dtype

ARRAYS_NAME = "targets.npz"
PRIORS_NAME = "priors.npz"
HELDOUT_SPLITS = ("val", "test")
SUMMARY_NAME = "summary.json"
# (ids, probs, rest) at some positions: what model.ngram_expert mixes in (minigpt.model.ngram_expert.Prior)
Prior = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
FIX = "run `dvc repro soft_targets` (or `dvc repro`)"


def build_soft_targets(encoded_dir: str | Path, out_dir: str | Path, order: int, top: int, folds: int,
                       discount: float, custody: Custody | None = None) -> dict:
    """Write out_dir (atomically, as a whole directory) from encoded train; return the summary. Order 0 writes
    the summary alone (no targets). `custody` (the stage's record) checks encoded train and records what was used."""
    meta = load_meta(encoded_dir)
    vocab = int(meta["vocab_size"])
    summary = {"order": order, "top": min(top, vocab), "folds": folds, "discount": discount, "vocab_size": vocab,
               **{f"{split}_sha256": meta["splits"][split]["sha256"] for split in ("train", *HELDOUT_SPLITS)}}
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
                np.savez(handle, ids=ids.astype(ids_dtype(vocab)), probs=probs.astype(np.float16),
                         rest=(1 - kept).astype(np.float32))
            summary.update(positions=len(train), seconds=round(time.perf_counter() - started, 2),
                           # every position but the first, which has no context
                           bits_per_token=float(bits[1:].mean()), kept_mass=float(kept[1:].mean()))
            summary["heldout_bits_per_token"] = _write_heldout_priors(tmp / PRIORS_NAME, train, encoded_dir, vocab,
                                                                     order, top, discount, custody)
        atomic_write_json(tmp / SUMMARY_NAME, summary)
    return summary


def _write_heldout_priors(path: Path, train: np.ndarray, encoded_dir, vocab: int, order: int, top: int,
                          discount: float, custody: Custody | None) -> dict:
    """priors.npz: at every position of val and test, the n-gram counted on all of train (position 0, with no
    context, gets its lowest order); returns the bits per token of each split's targets under it."""
    counts = count_ngrams(train, vocab, order)
    arrays, bits_per_token = {}, {}
    for split in HELDOUT_SPLITS:
        if custody is not None:
            custody.take(f"{split} ids")
        ids = np.asarray(load_ids(encoded_dir, split), dtype=np.int64)
        if custody is not None:
            custody.used(f"{split} ids", ids)
        top_ids, probs, bits, kept = heldout_topk(counts, ids, np.arange(len(ids)), top, discount)
        arrays.update({f"{split}_ids": top_ids.astype(ids_dtype(vocab)), f"{split}_probs": probs.astype(np.float16),
                       f"{split}_rest": (1 - kept).astype(np.float32)})
        bits_per_token[split] = float(bits[1:].mean())
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    return bits_per_token


@dataclass(frozen=True)
class Priors:
    """An n-gram's distribution at every position of one split: ids [N, top] (uint8, or int32 for a vocabulary past
    256), probs [N, top] (fp16, renormalised over the kept tokens), rest [N] (fp32, the mass outside them)."""
    ids: torch.Tensor
    probs: torch.Tensor
    rest: torch.Tensor

    def at(self, positions: torch.Tensor, device: torch.device | str = "cpu") -> Prior:
        """(ids long, probs float32, rest float32) at `positions`, on `device`."""
        return (self.ids[positions].to(device, dtype=torch.long), self.probs[positions].to(device, torch.float32),
                self.rest[positions].to(device, torch.float32))

    def for_targets(self, starts: torch.Tensor, block_size: int, device: torch.device | str = "cpu") -> Prior:
        """The distributions of the targets of the windows drawn at `starts` (targets[:, t] is ids[starts + t + 1])."""
        return self.at(starts[:, None] + 1 + torch.arange(block_size), device)


@dataclass(frozen=True)
class SoftTargets:
    """The targets of every train position: ids [N, top] (uint8, or int32 for a vocabulary past 256), probs [N, top]
    (fp16), rest [N] (fp32, the cross-fitted n-gram's mass outside the kept tokens; None in targets built by hand,
    read as zeros)."""
    ids: torch.Tensor
    probs: torch.Tensor
    summary: dict
    rest: torch.Tensor | None = None

    def priors(self) -> Priors:
        return self._priors

    @functools.cached_property
    def _priors(self) -> Priors:  # built once: every batch's lookup goes through it
        return Priors(self.ids, self.probs, torch.zeros(len(self.ids)) if self.rest is None else self.rest)

    def at(self, positions: torch.Tensor, device: torch.device | str = "cpu") -> Prior:
        """(ids long, probs float32, rest float32), [*positions.shape, top] ([*positions.shape] for rest)."""
        return self.priors().at(positions, device)

    def for_targets(self, starts: torch.Tensor, block_size: int, device: torch.device | str = "cpu") -> Prior:
        """The targets of the windows get_batch drew at `starts`: targets[:, t] is train[starts + t + 1], so
        its soft target is the distribution at that position (Priors.for_targets: one offset for every split)."""
        return self.priors().for_targets(starts, block_size, device)


def load_soft_targets_summary(folder: str | Path, encoded_dir: str | Path) -> dict:
    """summary.json, refused unless targets were built (order > 0) from exactly this encoded train."""
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
    return summary


# what identifies the n-gram a model.ngram_expert checkpoint was trained with
NGRAM_IDENTITY_KEYS = ("order", "top", "folds", "discount", "vocab_size", "train_sha256")


def ngram_identity(summary: dict) -> dict:
    return {key: summary.get(key) for key in NGRAM_IDENTITY_KEYS}


def require_trained_ngram(checkpoint: dict, summary: dict, source: str) -> None:
    """Refuse data/soft_targets unless it holds the n-gram the model.ngram_expert checkpoint was trained with."""
    trained, here = checkpoint.get("ngram_expert_source") or {}, ngram_identity(summary)
    changed = [f"{key} {trained.get(key)!r} -> {here[key]!r}" for key in NGRAM_IDENTITY_KEYS
               if trained.get(key) != here[key]]
    if changed:
        raise DataError(f"{source}: trained with model.ngram_expert mixing in another n-gram than data/soft_targets "
                        f"now holds ({'; '.join(changed)}); rebuild the soft targets the run was trained with, or "
                        "retrain (`dvc repro`).")


def load_soft_targets(folder: str | Path, encoded_dir: str | Path) -> SoftTargets:
    """The soft targets, refused unless they were built from exactly this encoded train (never unpickled)."""
    folder = Path(folder)
    summary = load_soft_targets_summary(folder, encoded_dir)
    meta = load_meta(encoded_dir)
    path = folder / ARRAYS_NAME
    arrays = _load_arrays(path, ("ids", "probs", "rest"), "a soft-targets archive")
    train = _priors_of(path, "train", arrays, "", meta["splits"]["train"]["length"], summary["top"])
    return SoftTargets(train.ids, train.probs, summary, train.rest)


def load_heldout_priors(folder: str | Path, encoded_dir: str | Path) -> dict[str, Priors]:
    """{"val": Priors, "test": Priors} of priors.npz, refused unless built from exactly these encoded splits."""
    folder = Path(folder)
    summary = load_soft_targets_summary(folder, encoded_dir)
    meta = load_meta(encoded_dir)
    path = folder / PRIORS_NAME
    arrays = _load_arrays(path, [f"{split}_{key}" for split in HELDOUT_SPLITS for key in ("ids", "probs", "rest")],
                          "an n-gram priors archive")
    priors = {}
    for split in HELDOUT_SPLITS:
        if summary.get(f"{split}_sha256") != meta["splits"][split]["sha256"]:
            raise DataError(f"{path}: built from another encoded {split} than {encoded_dir}; {FIX}.")
        priors[split] = _priors_of(path, split, arrays, f"{split}_", meta["splits"][split]["length"], summary["top"])
    return priors


def _load_arrays(path: Path, names, what: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in names}
    except FileNotFoundError:
        raise DataError(f"{path}: not found; {FIX}.") from None
    except (ValueError, KeyError, OSError) as exc:
        raise DataError(f"{path}: not {what} ({exc}); {FIX}.") from None


def _priors_of(path: Path, split: str, arrays: dict, prefix: str, positions: int, top: int) -> Priors:
    """One split's arrays as Priors, refused unless there is a row per position of `top` tokens."""
    ids, probs, rest = (arrays[prefix + key] for key in ("ids", "probs", "rest"))
    if ids.shape != (positions, top) or probs.shape != (positions, top) or rest.shape != (positions,):
        raise DataError(f"{path}: {split} arrays of shape {ids.shape} / {probs.shape} / {rest.shape}, expected "
                        f"({positions}, {top}) and ({positions},) ({split} positions, soft_targets.top); {FIX}.")
    ids = torch.from_numpy(ids if ids.dtype == np.uint8 else ids.astype(np.int32))
    return Priors(ids, torch.from_numpy(probs), torch.from_numpy(rest))


class NextTokenNgram:
    """The soft targets' n-gram counted on all of train, asked for the next token after a text (generation under
    model.ngram_expert): called with IDs [B, T], it returns the Prior of position T, [B, 1, ...]."""

    def __init__(self, train: np.ndarray, summary: dict):
        self.order, self.top, self.discount = int(summary["order"]), int(summary["top"]), float(summary["discount"])
        self.counts = count_ngrams(np.asarray(train, dtype=np.int64), int(summary["vocab_size"]), self.order)

    def __call__(self, ids: torch.Tensor) -> Prior:
        rows = []
        for row in ids.cpu().numpy().astype(np.int64):
            context = row[-(self.order - 1):] if self.order > 1 else row[:0]
            text = np.concatenate([context, [0]])  # the next token's slot: its ID is not read
            top_ids, probs, _, kept = heldout_topk(self.counts, text, np.array([len(context)]), self.top,
                                                   self.discount)
            rows.append((top_ids[0], probs[0], 1 - kept[0]))
        device = ids.device
        return (torch.tensor(np.stack([r[0] for r in rows]), device=device)[:, None, :],
                torch.tensor(np.stack([r[1] for r in rows]), device=device)[:, None, :],
                torch.tensor(np.array([r[2] for r in rows], dtype=np.float32), device=device)[:, None])


def load_next_token_ngram(folder: str | Path, encoded_dir: str | Path) -> NextTokenNgram:
    """The n-gram of data/soft_targets, counted on this encoded train (refused unless the targets were built from
    it)."""
    summary = load_soft_targets_summary(folder, encoded_dir)
    return NextTokenNgram(load_ids(encoded_dir, "train"), summary)
