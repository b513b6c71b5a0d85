"""Vectorised character statistics: a string viewed as an array of Unicode code points."""

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
