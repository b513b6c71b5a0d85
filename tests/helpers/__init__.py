"""What the tests share: the repository root, the WikiText-shaped fixture, throwaway projects, tiny models and
the bugs planted on purpose. Test modules import from here, never from each other or from conftest."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
