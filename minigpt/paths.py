"""Where each pipeline artifact lives (relative to the repository root, as dvc.yaml declares them)."""

from pathlib import Path

RAW_DIR = Path("data/raw")
CLEAN_DIR = Path("data/clean")
TOKENIZER_FILE = Path("data/tokenizer/char_tokenizer.json")
ENCODED_DIR = Path("data/encoded")
REPORTS_DIR = Path("reports")
CLEAN_REPORT = REPORTS_DIR / "clean.json"
DEBUG_REPORT = REPORTS_DIR / "debug_report.json"
MODELS_DIR = Path("models")
TRAIN_LOCK = MODELS_DIR / ".train.lock"  # held by the one trainer writing models/ and the run's reports


def clean_split_path(split: str, clean_dir: Path = CLEAN_DIR) -> Path:
    return clean_dir / f"{split}.txt"
SPLITS = ("train", "val", "test")
