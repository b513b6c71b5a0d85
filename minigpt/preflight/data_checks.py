"""Preflight checks of the data, in the order it flows: the environment, the artifacts on disk, the tokenizer
against every split, the token IDs, and the batches (targets shifted by one)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.data import batching
from minigpt.data.encode import load_ids, load_meta, split_file, split_hashes
from minigpt.data.textstats import codepoints, from_codepoints
from minigpt.data.tokenizer import CharTokenizer
from minigpt.data.tokenizer_files import load_tokenizer
from minigpt.model.devices import mps_available
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.preflight.dvc_cache import damaged_cache_copy

STRETCH = 60  # characters of each split (and of a batch row) shown decoded in the report


def check_environment(ctx: Context) -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "device": str(ctx.device),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mps_available": mps_available(),
        "threads": torch.get_num_threads(),
    }


def required_files(ctx: Context) -> list[Path]:
    return [
        *[ctx.path(clean_split_path(split)) for split in SPLITS],
        ctx.path(TOKENIZER_FILE),
        ctx.path(ENCODED_DIR / "meta.json"),
        *[split_file(ctx.path(ENCODED_DIR), split) for split in SPLITS],
    ]


def check_files(ctx: Context) -> dict:
    sizes, problems = {}, []
    for path in required_files(ctx):
        key = str(path.relative_to(ctx.root)) if path.is_relative_to(ctx.root) else str(path)
        if not path.is_file():
            problems.append(f"{key} is missing")
        elif path.stat().st_size == 0:
            problems.append(f"{key} is empty")
        else:
            sizes[key] = path.stat().st_size
    if problems:
        raise CheckFailed("; ".join(problems), {"sizes": sizes})
    try:
        ctx.tokenizer = load_tokenizer(ctx.path(TOKENIZER_FILE))
        ctx.meta = load_meta(ctx.path(ENCODED_DIR))
    except MinigptError as exc:
        raise CheckFailed(str(exc), {"sizes": sizes}) from None
    now = split_hashes(ctx.path(ENCODED_DIR))
    changed = [split for split in SPLITS if now[split] != ctx.meta["splits"][split]["sha256"]]
    if changed:
        message = f"encoded arrays changed after encode (SHA-256 differs from meta.json): {', '.join(changed)}"
        damaged = {split: damaged_cache_copy(ctx.root, ctx.path(split_file(ENCODED_DIR, split))) for split in changed}
        damaged = {split: cached for split, cached in damaged.items() if cached}
        if damaged:
            message += ("; checked out from a damaged DVC cache copy (its bytes no longer have the MD5 it is stored "
                        f"under): {'; '.join(str(c) for c in damaged.values())}. Delete it, then run `dvc repro "
                        "--force --single-item encode` in the project: encode rewrites the split and DVC stores a "
                        "sound copy")
        raise CheckFailed(message, {"sizes": sizes, "damaged_cache_copies": {s: str(c) for s, c in damaged.items()}})
    return {"sizes": sizes}


def check_tokenizer(ctx: Context) -> dict:
    """Every stored ID of every split decodes to exactly its clean text, and re-encodes to the same IDs."""
    tok = ctx.tokenizer
    chars = [tok.decode([i]) for i in range(tok.vocab_size)]
    measured: dict[str, Any] = {"tokenizer_fingerprint": tok.fingerprint,
                                "encoded_with": ctx.meta["tokenizer_fingerprint"],
                                "vocab_size": tok.vocab_size,
                                "kind": "char" if isinstance(tok, CharTokenizer) else "bpe",
                                "first_chars": chars[:12], "last_chars": chars[-12:],
                                "splits": {}}
    ctx.summary.update(tokenizer_fingerprint=tok.fingerprint, vocab_size=tok.vocab_size)
    problems = []
    for split in SPLITS:
        ids = np.asarray(load_ids(ctx.path(ENCODED_DIR), split))
        clean = codepoints(ctx.path(clean_split_path(split)).read_bytes().decode("utf-8"))
        try:
            decoded = tok.decode_codepoints(ids)  # vectorised decode of the whole split
        except MinigptError as exc:
            problems.append(f"{split}: {exc}")
            continue
        common = min(decoded.size, clean.size)
        diff = np.flatnonzero(decoded[:common] != clean[:common])
        mismatch = int(diff[0]) if diff.size else (common if decoded.size != clean.size else None)
        round_trip = bool(np.array_equal(tok.encode(from_codepoints(decoded)), ids))
        measured["splits"][split] = {"chars_checked": int(ids.size), "clean_chars": int(clean.size),
                                     "matches_clean_text": mismatch is None, "first_mismatch": mismatch,
                                     "round_trip_equal": round_trip,
                                     # what a person compares: the split's start decoded from its IDs, and as cleaned
                                     "decoded_start": from_codepoints(decoded[:STRETCH]),
                                     "clean_start": from_codepoints(clean[:STRETCH])}
        if not round_trip:
            problems.append(f"{split}: encode(decode(ids)) != ids")
        if mismatch is not None:
            got = from_codepoints(decoded[mismatch:mismatch + 20])
            want = from_codepoints(clean[mismatch:mismatch + 20])
            problems.append(f"decoded {split} IDs differ from {clean_split_path(split)} at character {mismatch} "
                            f"(lengths {decoded.size} vs {clean.size}): {got!r} vs {want!r}")
    if ctx.meta["tokenizer_fingerprint"] != tok.fingerprint:
        problems.append("data/encoded was encoded with a different tokenizer than data/tokenizer/tokenizer.json "
                        "(fingerprints differ)")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_token_ids(ctx: Context) -> dict:
    vocab = ctx.tokenizer.vocab_size
    window = ctx.model_config.block_size + 1
    ranges, bad = {}, []
    for split in SPLITS:
        ids = load_ids(ctx.path(ENCODED_DIR), split)
        if ids.size == 0:
            ranges[split] = {"dtype": str(ids.dtype), "length": 0}
            bad.append(f"{split}: the split is empty")
            continue
        lo, hi = int(ids.min()), int(ids.max())
        ranges[split] = {"dtype": str(ids.dtype), "min": lo, "max": hi, "length": int(ids.size)}
        if ids.dtype.kind not in "ui":
            bad.append(f"{split}: dtype {ids.dtype} is not an integer type")
        elif lo < 0 or hi >= vocab:
            bad.append(f"{split}: IDs span [{lo}, {hi}] but must lie in [0, {vocab - 1}]")
        if ids.size < window:
            bad.append(f"{split}: {ids.size} tokens, fewer than one window of model.block_size + 1 = {window} "
                       "(use more text or a smaller model.block_size)")
    ctx.summary["token_range"] = ranges
    measured = {"vocab_size": vocab, "min_split_length": window, "splits": ranges}
    if bad:
        raise CheckFailed("; ".join(bad), measured)
    ctx.splits = {split: torch.from_numpy(np.asarray(load_ids(ctx.path(ENCODED_DIR), split),
                                                     dtype=np.int64)) for split in SPLITS}
    return measured


def check_batch_shift(ctx: Context) -> dict:
    cfg = ctx.model_config
    batch_size = ctx.params.preflight.batch_size
    inputs, targets = batching.get_batch(ctx.splits["train"], batch_size, cfg.block_size, ctx.device, ctx.generator(1))
    measured = {
        "inputs_shape": list(inputs.shape),
        "targets_shape": list(targets.shape),
        "dtypes": [str(inputs.dtype), str(targets.dtype)],
        "device": str(inputs.device),
    }
    if inputs.dim() == 2 and targets.dim() == 2 and len(inputs) and len(targets):
        # the guide's own look at a batch: the first row of inputs and of targets, decoded
        measured.update(decoded_input=ctx.tokenizer.decode(inputs[0, :STRETCH].tolist()),
                        decoded_target=ctx.tokenizer.decode(targets[0, :STRETCH].tolist()))
    problems = []
    if inputs.shape != targets.shape or list(inputs.shape) != [batch_size, cfg.block_size]:
        problems.append(f"shapes {list(inputs.shape)} / {list(targets.shape)}, expected [{batch_size}, "
                        f"{cfg.block_size}] both")
    if inputs.dtype != torch.long or targets.dtype != torch.long:
        problems.append(f"dtypes {inputs.dtype} / {targets.dtype}, expected torch.int64")
    if inputs.device.type != ctx.device.type or targets.device.type != ctx.device.type:
        problems.append(f"batch on {inputs.device}, model on {ctx.device}")
    if not problems:
        shifted = bool(torch.equal(inputs[:, 1:], targets[:, :-1]))
        identical = float((inputs == targets).float().mean())
        measured.update(shift_ok=shifted, identical_fraction=round(identical, 4))
        if not shifted:
            problems.append("inputs[:, 1:] != targets[:, :-1]: targets are not the inputs shifted by one")
        elif identical == 1.0:
            problems.append("targets equal inputs")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    ctx.batch = (inputs, targets)
    ctx.summary["batch_shape"] = list(inputs.shape)
    return measured



CHECKS: tuple[Check, ...] = (
    Check("environment", check_environment, (), "informational", ()),
    Check("files", check_files, (), "every required artifact exists, is non-empty and matches meta.json",
          ("a stage did not run or was interrupted: run `dvc repro encode`",
           "an artifact was edited or replaced by hand",
           "its DVC cache copy is damaged (the message names it): a checkout or a queued experiment copied it")),
    Check("tokenizer", check_tokenizer, ("files",),
          "every stored ID of every split decodes to exactly its clean text and re-encodes to the same IDs",
          ("tokenizer file swapped or rebuilt after encode (different character order)",
           "encode ran with a different tokenizer: rerun `dvc repro encode`", "clean text changed after encoding")),
    Check("token_ids", check_token_ids, ("files",),
          lambda c: (f"0 <= id < vocab_size ({c.tokenizer.vocab_size}) and at least model.block_size + 1 = "
                     f"{c.model_config.block_size + 1} tokens in every split"),
          ("data encoded with a different, larger vocabulary", "off-by-one: an ID equal to vocab_size",
           "IDs overflowed a too-small dtype", "a split too short for one window (tiny corpus, huge block_size)")),
    Check("batch_shift", check_batch_shift, ("token_ids",),
          "inputs, targets: same shape [B, T], torch.long, on the model's device; inputs[:, 1:] == targets[:, :-1]",
          ("targets not shifted (inputs == targets: the model learns to copy)",
           "shifted the wrong way or by more than one",
           "batch left on the CPU while the model is on the accelerator", "IDs cast to float")),
)
