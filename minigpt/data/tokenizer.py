"""CharTokenizer: one ID per character, sorted by code point, with a fingerprint that binds artifacts to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_write_json, read_json
from minigpt.data.textstats import codepoints, from_codepoints

FORMAT = "minigpt-char-tokenizer"
VERSION = 1
UNICODE_SIZE = 0x110000  # code points are < this: a table this long needs no bounds check


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every ID: uint8 up to 256 symbols, else uint16 (else uint32)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DataError(f"vocabulary of {vocab_size} characters is too large")


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
        # code point -> ID over all of Unicode (1.1 MB for a uint8 vocabulary); vocab_size marks "not in the
        # vocabulary", so the table's dtype is the smallest that also holds that sentinel
        self._unknown = len(self.chars)
        self._lut = np.full(UNICODE_SIZE, self._unknown, dtype=ids_dtype(len(self.chars) + 1))
        self._lut[self._points] = np.arange(len(self.chars))

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
        """IDs for every character of `text` (one table lookup per character, vectorised, in the smallest
        unsigned dtype); an unknown character is an error naming it and its position."""
        ids = np.take(self._lut, codepoints(text))
        if ids.size and int(ids.max()) == self._unknown:
            pos = int(np.argmax(ids == self._unknown))
            ch = text[pos]
            raise DataError(
                f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the tokenizer's vocabulary; "
                "clean the text with the same settings as the training data (its placeholder maps unseen characters)."
            )
        return ids

    def decode_codepoints(self, ids) -> np.ndarray:
        """The code point of every ID, vectorised (compare with `textstats.codepoints(text)` without a string)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token IDs must be in [0, {self.vocab_size}); got range [{ids.min()}, {ids.max()}]")
        return self._points[ids]

    def decode(self, ids) -> str:
        return from_codepoints(self.decode_codepoints(ids))

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of `text` outside the vocabulary, once each in order of appearance."""
        known = set(self.chars)
        return [ch for ch in dict.fromkeys(text) if ch not in known]

    def char_counts(self) -> np.ndarray:
        """Characters per ID: one each (BPETokenizer's differ; bits per character are computed from these)."""
        return np.ones(self.vocab_size, dtype=np.int64)

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
        payload = read_tokenizer_file(path, FORMAT, "chars", list)
        tokenizer = cls(payload["chars"], payload.get("placeholder"))
        check_fingerprint(path, payload, tokenizer.fingerprint, "its chars")
        return tokenizer


def read_tokenizer_file(path: Path, file_format: str, content: str, content_type: type) -> dict:
    """A tokenizer file's JSON, refused unless it has the format's name and its content field (`content`)."""
    payload = read_json(path, missing="tokenizer file not found", invalid="not a valid tokenizer JSON",
                        fix="run `dvc repro tokenizer`.", error=DataError)
    if (not isinstance(payload, dict) or payload.get("format") != file_format
            or not isinstance(payload.get(content), content_type)):
        kind = "list" if content_type is list else "object"
        raise DataError(f"{path}: not a {file_format} file (needs 'format' and a '{content}' {kind}); run `dvc repro "
                        "tokenizer`.")
    return payload


def check_fingerprint(path: Path, payload: dict, fingerprint: str, of_what: str) -> None:
    """The stored fingerprint must be the one the loaded vocabulary has: anything else is a hand edit."""
    if payload.get("fingerprint") != fingerprint:
        raise DataError(f"{path}: stored fingerprint {payload.get('fingerprint')} does not match {of_what} "
                        f"({fingerprint}); the file was edited by hand. Rebuild it with `dvc repro tokenizer`.")
