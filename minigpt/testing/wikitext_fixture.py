"""A small WikiText-shaped corpus built in the test itself (no network, no ../shared).

Articles with ` = Title = ` and ` = = Section = = ` headings, ` @-@ ` / ` @,@ ` markup, blank ` ` lines as in
the raw release, non-ASCII letters, and characters in val/test that never occur in train.
"""

from __future__ import annotations

import hashlib
import io
import random
import zipfile
from pathlib import Path

from minigpt.core.paths import SPLIT_FILES
from minigpt.data.fetch import Release

WORDS = (
    "the of and in to a was is for on as by with at from his that which it were an are be first after "
    "album song river city army game season film series north south during new two three century "
    "station battle church king team league road building club war world early later known also played "
    "released against between over when its their would into had been most began island storm"
).split()
ACCENTED = ["café", "Ségolène", "Zürich", "naïve", "Málaga", "Åland", "Dvořák"]
# val/test only: never seen in train, so clean must map them to the placeholder
UNSEEN = ["Ωmega", "ÿ", "東京", "ß"]


def _sentence(rng: random.Random, extra: list[str]) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 16))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), f"{rng.randint(1, 99)} @,@ {rng.randint(100, 999)}")
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), f"{rng.choice(WORDS)} @-@ {rng.choice(WORDS)}")
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), f"{rng.randint(1, 9)} @.@ {rng.randint(0, 9)}")
    if extra and rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(extra))
    words[0] = words[0].capitalize()
    return " ".join(words) + " ."


def make_split(seed: int, articles: int, extra: list[str]) -> str:
    rng = random.Random(seed)
    lines = []
    for a in range(articles):
        lines += [" ", f" = {rng.choice(WORDS).capitalize()} {rng.choice(WORDS)} {a} = ", " "]
        for s in range(3):
            if s:
                lines += [f" = = {rng.choice(WORDS).capitalize()} {s} = = ", " "]
            paragraph = " ".join(_sentence(rng, extra) for _ in range(rng.randint(4, 9)))
            lines += [" " + paragraph + " ", " "]
    return "\n".join(lines) + "\n"


def make_texts(train_articles: int = 40) -> dict[str, str]:
    """WikiText file name -> text."""
    return {
        "wiki.train.raw": make_split(1, train_articles, ACCENTED),
        "wiki.valid.raw": make_split(2, max(4, train_articles // 8), ACCENTED + UNSEEN),
        "wiki.test.raw": make_split(3, max(4, train_articles // 8), ACCENTED + UNSEEN),
    }


def write_directory(root: Path, texts: dict[str, str] | None = None) -> Path:
    texts = texts or make_texts()
    root.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (root / name).write_bytes(text.encode("utf-8"))
    return root


def write_zip(path: Path, files: dict[str, bytes], folder: str = "wikitext-2-raw") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(f"{folder}/{name}" if folder else name, data)
    path.write_bytes(buffer.getvalue())
    return path


def release_for(zip_path: Path, files: dict[str, bytes]) -> Release:
    """The 'published' checksums of a fixture archive, computed here."""
    data = zip_path.read_bytes()
    return Release(
        name="fixture-wikitext",
        archive_sha256=hashlib.sha256(data).hexdigest(),
        archive_bytes=len(data),
        members={name: (hashlib.sha256(b).hexdigest(),
                        len(b)) for name, b in files.items() if name in SPLIT_FILES.values()},
    )
