"""The run's tokenizer, whichever kind params.yaml's `tokenizer` section chose: built by the tokenizer stage from
clean train, loaded by every later stage from data/tokenizer/tokenizer.json (the file's "format" says which)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from minigpt.data.bpe import FORMAT as BPE_FORMAT
from minigpt.data.bpe import BPETokenizer
from minigpt.data.tokenizer import FORMAT as CHAR_FORMAT
from minigpt.data.tokenizer import CharTokenizer

Tokenizer = Union[CharTokenizer, BPETokenizer]
KINDS = {CHAR_FORMAT: CharTokenizer, BPE_FORMAT: BPETokenizer}


def build_tokenizer(cfg, placeholder: str, train_text: str) -> Tokenizer:
    """`tokenizer.kind` char: the characters of clean train and the placeholder; bpe: byte-level BPE learnt on it."""
    if cfg.kind == "bpe":
        return BPETokenizer.train(train_text, cfg.vocab_size, cfg.special_tokens, placeholder)
    return CharTokenizer.from_text(train_text, placeholder=placeholder)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer stored at `path`, of the kind its "format" names (each kind checks the rest of the file)."""
    path = Path(path)
    try:
        kind = KINDS.get(json.loads(path.read_text(encoding="utf-8")).get("format"), CharTokenizer)
    except (OSError, ValueError, AttributeError):
        kind = CharTokenizer  # it reports the missing or unreadable file in its own words
    return kind.load(path)
