"""Stage `encode`: each clean split as a compact, memory-mappable .npy array of token IDs, plus meta.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_directory, atomic_write_json, read_json, sha256_file
from minigpt.core.paths import SPLITS
from minigpt.data.tokenizer import ids_dtype
from minigpt.data.tokenizer_files import Tokenizer

META_NAME = "meta.json"


def encode_splits(texts: dict[str, str], tokenizer: Tokenizer, out_dir: str | Path) -> dict:
    """Write <split>.npy and meta.json to out_dir (atomically, as a whole directory); return the metadata."""
    dtype = ids_dtype(tokenizer.vocab_size)
    meta = {"tokenizer_fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size, "dtype": dtype.name,
            "splits": {}}
    with atomic_directory(out_dir) as tmp:
        for split in SPLITS:
            ids = tokenizer.encode(texts[split]).astype(dtype, copy=False)
            file = split_file(tmp, split)
            np.save(file, ids, allow_pickle=False)
            meta["splits"][split] = {"file": file.name, "length": int(ids.size), "sha256": sha256_file(file)}
        atomic_write_json(tmp / META_NAME, meta)
    return meta


def split_file(encoded_dir: str | Path, split: str) -> Path:
    return Path(encoded_dir) / f"{split}.npy"


def split_hashes(encoded_dir: str | Path, splits=SPLITS) -> dict[str, str | None]:
    """Each split's array SHA-256 (None where the file is missing): what meta.json, the preflight report and a
    checkpoint's resume fingerprint bind."""
    files = {split: split_file(encoded_dir, split) for split in splits}
    return {split: sha256_file(file) if file.is_file() else None for split, file in files.items()}


def load_meta(encoded_dir: str | Path) -> dict:
    path = Path(encoded_dir) / META_NAME
    meta = read_json(path, missing="not found", invalid="not valid JSON", fix="run `dvc repro encode`.",
                     error=DataError)
    splits = meta.get("splits") if isinstance(meta, dict) else None
    well_formed = (
        isinstance(meta, dict) and isinstance(meta.get("tokenizer_fingerprint"), str) and isinstance(splits, dict)
        and all(isinstance(splits.get(s), dict) and isinstance(splits[s].get("sha256"), str)
                and isinstance(splits[s].get("length"), int) for s in SPLITS)
    )
    if not well_formed:
        raise DataError(f"{path}: not an encode metadata file (needs 'tokenizer_fingerprint' and, for each of "
                        f"{', '.join(SPLITS)}, 'sha256' and 'length'); run `dvc repro encode`.")
    return meta


def load_ids(encoded_dir: str | Path, split: str) -> np.ndarray:
    """A split's IDs as a read-only memory map (never unpickled)."""
    path = split_file(encoded_dir, split)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"{path}: not found; run `dvc repro encode`.") from None
    except ValueError as exc:
        raise DataError(f"{path}: not a valid .npy array ({exc}); run `dvc repro encode`.") from None


def load_split(encoded_dir: str | Path, split: str) -> torch.Tensor:
    """A split as a torch.long tensor, the dtype the model's embedding expects."""
    return torch.from_numpy(np.asarray(load_ids(encoded_dir, split), dtype=np.int64))
