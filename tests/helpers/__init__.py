"""What the tests share: the repository root, throwaway projects, tiny models and fake machines (the WikiText-shaped
fixture and the bugs planted on purpose, which the benchmarks use too, are in minigpt/testing/). Test modules import
from here or minigpt/testing/, never from each other or from conftest."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
