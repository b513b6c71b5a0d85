"""BPETokenizer: byte-level BPE trained on clean train with Hugging Face `tokenizers`, behind CharTokenizer's
interface (vocab_size, encode, decode, fingerprint, save/load with the same refusals).

Byte-level means every string encodes (no unknown character) and decode(encode(text)) == text exactly. Bits per
character need each token's number of characters: `char_counts()[id]` counts the characters that *start* in the
token (its UTF-8 bytes that are not continuation bytes), so a character split across two tokens is counted once
and sum(char_counts()[encode(text)]) == len(text) for any text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from minigpt.core.errors import DataError
from minigpt.core.io_utils import atomic_write_json
from minigpt.data.textstats import codepoints
from minigpt.data.tokenizer import check_fingerprint, ids_dtype, read_tokenizer_file

FORMAT = "minigpt-bpe-tokenizer"
VERSION = 1


def _byte_symbols() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (the GPT-2 table): symbol -> byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[chr(byte)] = byte
        else:
            symbols[chr(256 + extra)] = byte
            extra += 1
    return symbols


def canonical_json(tokenizer_json: str) -> str:
    """The tokenizer's JSON with sorted keys and no whitespace: what the fingerprint hashes."""
    return json.dumps(json.loads(tokenizer_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class BPETokenizer:
    def __init__(self, tokenizer_json: str, placeholder: str | None = None):
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the library raises its own exception type for a malformed file
            raise DataError(f"not a loadable BPE tokenizer ({exc})") from None
        self._json = canonical_json(tokenizer_json)
        self.placeholder = placeholder

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: list[str] = (),
              placeholder: str | None = None) -> "BPETokenizer":
        """Byte-level BPE with `vocab_size` IDs (the 256 bytes, the special tokens, then merges) learnt on text."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < 256 + len(special_tokens):
            raise DataError(f"tokenizer.vocab_size = {vocab_size}: byte-level BPE needs at least 256 + "
                            f"{len(special_tokens)} special token(s); raise it")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator([text], trainer=trainer)
        return cls(tok.to_str(), placeholder)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=ids_dtype(self.vocab_size))

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(f"token IDs must be in [0, {self.vocab_size}); got range [{ids.min()}, {ids.max()}]")
        return self._tok.decode(ids.tolist(), skip_special_tokens=False)

    def decode_codepoints(self, ids) -> np.ndarray:
        """The code points of the decoded IDs (what preflight compares with the clean text)."""
        return codepoints(self.decode(ids))

    def unknown_characters(self, text: str) -> list[str]:
        """None: byte-level BPE encodes any text."""
        return []

    def char_counts(self) -> np.ndarray:
        """Per ID, the characters that start in it: its UTF-8 bytes that are not continuation bytes (10xxxxxx).
        A special token counts its own characters."""
        symbols, counts = _byte_symbols(), np.zeros(self.vocab_size, dtype=np.int64)
        special = {t.content for t in self._tok.get_added_tokens_decoder().values()}
        for token, index in self._tok.get_vocab().items():
            if token in special:
                counts[index] = len(token)
            else:
                counts[index] = sum(1 for symbol in token if symbols[symbol] & 0xC0 != 0x80)
        return counts

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "vocab_size": self.vocab_size, "placeholder": self.placeholder,
                "fingerprint": self.fingerprint, "tokenizer": json.loads(self._json)}

    def save(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        path = Path(path)
        payload = read_tokenizer_file(path, FORMAT, "tokenizer", dict)
        try:
            tokenizer = cls(json.dumps(payload["tokenizer"]), payload.get("placeholder"))
        except DataError as exc:
            raise DataError(f"{path}: {exc}; run `dvc repro tokenizer`.") from None
        check_fingerprint(path, payload, tokenizer.fingerprint, "its vocabulary and merges")
        return tokenizer
