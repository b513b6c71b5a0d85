"""Stage `clean`: deterministic text normalisation and the rare/unseen-character policy.

Per split, in order: line endings to "\\n" (CRLF and lone CR), Unicode normalisation (`clean.unicode_form`,
NFC by default: composed accents, nothing else changed), optional detokenisation of WikiText's " @-@ "
markup (off by default: the raw markup is kept). Then the vocabulary is fixed on train alone: characters seen
at least `clean.min_char_count` times in train are kept; every other character, in any split (including
characters of val/test never seen in train), becomes `clean.placeholder`. So the tokenizer built from clean
train (+ the placeholder) never meets an unknown character.
"""

from __future__ import annotations

import unicodedata
from collections import Counter

from minigpt.core.config import CleanConfig
from minigpt.data.textstats import char_counts

# WikiText tokenises hyphens and number separators as " @-@ ", " @,@ ", " @.@ ".
_MARKUP = {" @-@ ": "-", " @,@ ": ",", " @.@ ": "."}
TOP_REPLACED = 10


def normalise(text: str, cfg: CleanConfig) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if cfg.unicode_form != "none":
        text = unicodedata.normalize(cfg.unicode_form, text)
    if cfg.detokenize_markup:
        for markup, plain in _MARKUP.items():
            text = text.replace(markup, plain)
    return text


def kept_characters(train_text: str, cfg: CleanConfig) -> set[str]:
    """Characters of the normalised train split frequent enough to keep, plus the placeholder."""
    counts = char_counts(train_text)
    kept = {ch for ch, n in counts.items() if n >= cfg.min_char_count}
    return kept | {cfg.placeholder}


def apply_policy(text: str, kept: set[str], placeholder: str) -> tuple[str, Counter]:
    """Replace every character outside `kept` by the placeholder (str.translate: one C-level pass)."""
    counts = char_counts(text)
    dropped = {ch: n for ch, n in counts.items() if ch not in kept}
    if not dropped:
        return text, Counter()
    table = {ord(ch): placeholder for ch in dropped}
    return text.translate(table), Counter(dropped)


def clean_splits(raw: dict[str, str], cfg: CleanConfig) -> tuple[dict[str, str], dict]:
    """Clean every split; returns the cleaned texts and the report for reports/clean.json."""
    normalised = {split: normalise(text, cfg) for split, text in raw.items()}
    kept = kept_characters(normalised["train"], cfg)
    cleaned, splits_report = {}, {}
    for split, text in normalised.items():
        out, replaced = apply_policy(text, kept, cfg.placeholder)
        cleaned[split] = out
        splits_report[split] = {
            "chars_in": len(raw[split]),
            "chars_out": len(out),
            "vocab_in": len(set(raw[split])),
            "vocab_out": len(set(out)),
            "replaced": sum(replaced.values()),
            "replaced_distinct": len(replaced),
            "most_replaced": [
                {"char": ch, "codepoint": f"U+{ord(ch):04X}",
                 "count": n} for ch, n in replaced.most_common(TOP_REPLACED)
            ],
        }
    report = {
        "settings": {
            "unicode_form": cfg.unicode_form,
            "min_char_count": cfg.min_char_count,
            "placeholder": f"U+{ord(cfg.placeholder):04X}",
            "detokenize_markup": cfg.detokenize_markup,
        },
        "vocab_size": len(kept),
        "splits": splits_report,
    }
    return cleaned, report
