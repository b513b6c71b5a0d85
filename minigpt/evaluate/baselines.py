"""Stage `baselines`: classical predictors of every character of val and test (positions 1..len-1 of each clean
split, once each), in bits per character, fitted on clean train. They always work on characters (the vocabulary
the character tokenizer builds from clean train and the placeholder), whichever tokenizer the model uses: a
character model scores exactly these targets; a BPE model all but the characters of its first token.

- static (fitted on train, then frozen, like the model): uniform (log2 V), unigram (add-one train frequencies),
  and interpolated Kneser-Ney character n-grams (minigpt.evaluate.ngram) of the orders in `baselines.ngram_orders`;
- adaptive (conditional compressors, which keep learning on the split while they code it, so they are not the
  same kind of model as a static network): 8 * (|C(train + split)| - |C(train + split[:1])|) / (len(split) - 1)
  bits per target for C = xz (stdlib lzma, preset 9e) and PPMd (the pyppmd package), over the token IDs as bytes
  (one byte per ID while the vocabulary fits in one, else two, little-endian).

What depends only on the data is computed here once, so an LR sweep never refits it; evaluate reads the ladder.
"""

from __future__ import annotations

import lzma
import math
import time
from pathlib import Path

import numpy as np

from minigpt.core.io_utils import sha256_bytes
from minigpt.core.paths import clean_split_path
from minigpt.core.provenance import Custody
from minigpt.core.stage import read_text
from minigpt.data.tokenizer import CharTokenizer
from minigpt.evaluate.ngram import kneser_ney_bits

SCORED_SPLITS = ("val", "test")


def unigram_bits(train: np.ndarray, split: np.ndarray, vocab_size: int) -> np.ndarray:
    """-log2 p of split's targets under add-one smoothed train character frequencies."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size) + 1.0
    return -np.log2(counts / counts.sum())[np.asarray(split[1:], dtype=np.int64)]


def id_width(vocab_size: int) -> int:
    """Bytes per token ID when the IDs are coded as bytes: one while the vocabulary fits in a byte, else two."""
    return 1 if vocab_size <= 256 else 2


def ids_as_bytes(ids: np.ndarray, vocab_size: int) -> bytes:
    dtype = np.uint8 if id_width(vocab_size) == 1 else np.dtype("<u2")
    return np.asarray(ids).astype(dtype).tobytes()


def conditional_bits(compress, train: bytes, split: bytes, width: int) -> float:
    """Total bits C spends on split[width:] after seeing train and split's first token (width bytes a token)."""
    return 8.0 * (len(compress(train + split)) - len(compress(train + split[:width])))


def xz(data: bytes) -> bytes:
    return lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)


def ppmd(order: int, mem_mb: int):
    import pyppmd

    return lambda data: pyppmd.compress(data, max_order=order, mem_size=mem_mb << 20)


def _row(name: str, kind: str, bits: dict[str, float], tokens: dict[str, int], seconds: float, **extra) -> dict:
    return {"name": name, "kind": kind, **extra, "seconds": round(seconds, 3),
            **{split: {"bpc": bits[split] / tokens[split], "bits": bits[split], "tokens": tokens[split]}
               for split in bits}}


def character_ids(clean_dir: str | Path, placeholder: str) -> tuple[dict[str, np.ndarray], int, dict[str, str]]:
    """Every clean split as character IDs (the vocabulary of clean train + the placeholder), the vocabulary size,
    and the SHA-256 of each clean split file (what evaluate checks the ladder against)."""
    clean_dir = Path(clean_dir)
    texts = {split: read_text(clean_split_path(split, clean_dir)) for split in ("train", *SCORED_SPLITS)}
    chars = CharTokenizer.from_text(texts["train"], placeholder=placeholder)
    ids = {split: np.asarray(chars.encode(text)) for split, text in texts.items()}
    # read_text decodes the file's bytes exactly, so hashing the text re-encoded is hashing the file
    hashes = {split: sha256_bytes(text.encode("utf-8")) for split, text in texts.items()}
    return ids, chars.vocab_size, hashes


def baseline_ladder(clean_dir: str | Path, placeholder: str, cfg, custody: Custody | None = None) -> dict:
    """The ladder for reports: {"rows": [...], "best_static": name, "vocab_size", "data": clean split hashes}.
    `custody` (the stage's record) checks the clean splits and records the characters fitted on and scored."""
    roles = {"train": "fitted on", **{s: s for s in SCORED_SPLITS}}
    if custody is not None:
        for role in roles.values():
            custody.take(role)
    ids, vocab, hashes = character_ids(clean_dir, placeholder)
    train = ids["train"]
    splits = {s: ids[s] for s in SCORED_SPLITS}
    if custody is not None:  # every predictor below is fitted on `train` and scores `splits`: these very arrays
        for split, used in {"train": train, **splits}.items():
            custody.used(roles[split], used, kind="characters", placeholder=placeholder)
    tokens = {s: len(ids) - 1 for s, ids in splits.items()}
    rows = [_row("uniform", "static", {s: tokens[s] * math.log2(vocab) for s in splits}, tokens, 0.0)]
    started = time.perf_counter()
    rows.append(_row("unigram (add-one)", "static", {s: float(unigram_bits(train, ids, vocab).sum())
                                                      for s, ids in splits.items()}, tokens,
                     time.perf_counter() - started))
    started = time.perf_counter()
    ngram = kneser_ney_bits(train, splits, vocab, list(cfg.ngram_orders), cfg.discount)
    seconds = time.perf_counter() - started  # all orders come out of one counting pass
    for order in cfg.ngram_orders:
        rows.append(_row(f"{order}-gram Kneser-Ney", "static", {s: float(b.sum()) for s, b in ngram[order].items()},
                         tokens, seconds, order=order, discount=cfg.discount))
    width = id_width(vocab)
    train_bytes = ids_as_bytes(train, vocab)
    compressors = [("xz (lzma 9e)", xz, {})]
    if cfg.ppmd_order:
        compressors.append((f"PPMd order {cfg.ppmd_order}", ppmd(cfg.ppmd_order, cfg.ppmd_mem_mb),
                            {"order": cfg.ppmd_order, "mem_mb": cfg.ppmd_mem_mb}))
    for name, compress, extra in compressors:
        started = time.perf_counter()
        bits = {s: conditional_bits(compress, train_bytes, ids_as_bytes(ids, vocab),
                                    width) for s, ids in splits.items()}
        rows.append(_row(name, "adaptive", bits, tokens, time.perf_counter() - started, **extra))
    static = [r for r in rows if r["kind"] == "static"]
    best = min(static, key=lambda r: r["val"]["bpc"])
    return {"rows": rows, "best_static": best["name"], "vocab_size": vocab,
            "data": hashes}
