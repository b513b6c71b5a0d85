"""CharTokenizer: one ID per character, sorted by code point, with a fingerprint that binds artifacts to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from minigpt.errors import DataError
from minigpt.io_utils import atomic_write_json, read_json
from minigpt.textstats import codepoints, from_codepoints

FORMAT = "minigpt-char-tokenizer"
VERSION = 1


def fingerprint_of(chars: list[str]) -> str:
    """SHA-256 of the chars list as compact JSON (ensure_ascii=False, separators (",", ":"))."""
    text = json.dumps(chars, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CharTokenizer:
    def __init__(self, chars: list[str], placeholder: str | None = None):
        if not chars:
            raise DataError("a tokenizer needs at least one character")
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise DataError(f"tokenizer chars must be single characters; got {bad[0]!r}")
        if len(set(chars)) != len(chars):
            raise DataError("tokenizer chars contain duplicates")
        self.chars = list(chars)
        self.placeholder = placeholder
        self._points = codepoints("".join(self.chars)).astype(np.int64)
        # code point -> ID lookup table (-1: not in the vocabulary); at most 0x110000 entries
        self._lut = np.full(int(self._points.max()) + 1, -1, dtype=np.int32)
        self._lut[self._points] = np.arange(len(self.chars), dtype=np.int32)

    @classmethod
    def from_text(cls, text: str, placeholder: str | None = None) -> "CharTokenizer":
        chars = set(text)
        if placeholder is not None:
            chars.add(placeholder)
        return cls(sorted(chars), placeholder)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """IDs for every character of `text` (one table lookup per character, vectorised); an unknown
        character is an error naming it and its position."""
        points = codepoints(text)
        if points.size and int(points.max()) >= len(self._lut):
            ids = np.where(points < len(self._lut), self._lut[np.minimum(points, len(self._lut) - 1)], -1)
        else:
            ids = self._lut[points]
        if ids.size and int(ids.min()) < 0:
            pos = int(np.argmax(ids < 0))
            ch = text[pos]
            raise DataError(
                f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the tokenizer's vocabulary; "
                "clean the text with the same settings as the training data (its placeholder maps unseen characters)."
            )
        return ids

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token IDs must be in [0, {self.vocab_size}); got range [{ids.min()}, {ids.max()}]")
        return from_codepoints(self._points[ids])

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "vocab_size": self.vocab_size,
            "placeholder": self.placeholder,
            "fingerprint": self.fingerprint,
            "chars": self.chars,
        }

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        path = Path(path)
        payload = read_json(path, missing="tokenizer file not found", invalid="not a valid tokenizer JSON",
                            fix="run `dvc repro tokenizer`.", error=DataError)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT or not isinstance(payload.get("chars"), list):
            raise DataError(f"{path}: not a {FORMAT} file (needs 'format' and a 'chars' list); run `dvc repro tokenizer`.")
        tokenizer = cls(payload["chars"], payload.get("placeholder"))
        if payload.get("fingerprint") != tokenizer.fingerprint:
            raise DataError(
                f"{path}: stored fingerprint {payload.get('fingerprint')} does not match its chars "
                f"({tokenizer.fingerprint}); the file was edited by hand. Rebuild it with `dvc repro tokenizer`."
            )
        return tokenizer
