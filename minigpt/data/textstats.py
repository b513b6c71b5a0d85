"""Statistics of text: a string viewed as an array of Unicode code points (vectorised character counts), and
repetition in generated text (repeated n-gram share, longest repeated substring, longest character run)."""

from __future__ import annotations

import numpy as np


def codepoints(text: str) -> np.ndarray:
    """The text's code points as uint32, without a per-character Python loop."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def from_codepoints(points: np.ndarray) -> str:
    return np.ascontiguousarray(points, dtype="<u4").tobytes().decode("utf-32-le")


def char_counts(text: str) -> dict[str, int]:
    """Occurrences of each distinct character."""
    values, counts = np.unique(codepoints(text), return_counts=True)
    return {chr(v): int(c) for v, c in zip(values.tolist(), counts.tolist())}


def repeated_ngram_share(text: str, n: int) -> float:
    """Fraction of the text's character n-grams that are repeats of an earlier one (0: none repeated)."""
    grams = [text[i:i + n] for i in range(len(text) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def longest_repeated_substring(text: str) -> int:
    """Length of the longest substring that occurs at least twice (occurrences may overlap)."""
    def repeats(length: int) -> bool:
        seen = set()
        for i in range(len(text) - length + 1):
            piece = text[i:i + length]
            if piece in seen:
                return True
            seen.add(piece)
        return False

    lo, hi = 0, max(0, len(text) - 1)
    while lo < hi:  # a repeat of length L implies one of every shorter length: binary search
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if repeats(mid) else (lo, mid - 1)
    return lo


def longest_char_run(text: str) -> int:
    best = run = 0
    previous = None
    for ch in text:
        run = run + 1 if ch == previous else 1
        previous = ch
        best = max(best, run)
    return best


def repetition_metrics(text: str) -> dict:
    return {
        "repeated_4gram_share": round(repeated_ngram_share(text, 4), 4),
        "repeated_8gram_share": round(repeated_ngram_share(text, 8), 4),
        "longest_repeated_substring": longest_repeated_substring(text),
        "longest_char_run": longest_char_run(text),
    }
