"""minigpt: a reproducible, self-diagnosing pipeline for a character-level Mini-GPT on WikiText-2."""

__version__ = "0.1.0"
