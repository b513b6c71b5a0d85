"""Where each pipeline artifact lives (relative to the repository root, as dvc.yaml declares them)."""

from pathlib import Path

RAW_DIR = Path("data/raw")
# the released files of WikiText-2 raw, by split
SPLIT_FILES = {"train": "wiki.train.raw", "val": "wiki.valid.raw", "test": "wiki.test.raw"}
CLEAN_DIR = Path("data/clean")
TOKENIZER_FILE = Path("data/tokenizer/tokenizer.json")
ENCODED_DIR = Path("data/encoded")
# the classical baselines of the encoded splits: depend on the data alone (DVC-cached, so a sweep never refits them)
BASELINES_REPORT = Path("data/baselines/baselines.json")
# per train position, a cross-fitted n-gram's next-token distribution (train.distill_alpha mixes it into the loss)
SOFT_TARGETS_DIR = Path("data/soft_targets")
REPORTS_DIR = Path("reports")
CLEAN_REPORT = REPORTS_DIR / "clean.json"
DEBUG_REPORT = REPORTS_DIR / "debug_report.json"
MODELS_DIR = Path("models")
LATEST_CHECKPOINT = MODELS_DIR / "mini_gpt_latest.pt"
BEST_CHECKPOINT = MODELS_DIR / "mini_gpt_best.pt"
TRAIN_LOCK = MODELS_DIR / ".train.lock"  # held by the one trainer writing models/ and the run's reports
TRAIN_LOG = REPORTS_DIR / "train_log.jsonl"
TRAIN_SUMMARY = REPORTS_DIR / "train_summary.json"
TRAIN_PLOT_CSV = REPORTS_DIR / "plots" / "train.csv"
VAL_PLOT_CSV = REPORTS_DIR / "plots" / "val.csv"
CURVES_PNG = REPORTS_DIR / "train_curves.png"
EVAL_REPORT = REPORTS_DIR / "evaluation.json"
# per split, the summed NLL of contiguous blocks of the scored targets: what paired comparisons of runs resample
EVAL_BLOCKS = REPORTS_DIR / "eval_blocks.json"
GENERATION_REPORT = REPORTS_DIR / "generation.json"
SAMPLES_MD = REPORTS_DIR / "samples.md"
# the run's decision metrics (the only file DVC treats as metrics) and its offline page, written by `report`
RUN_METRICS = REPORTS_DIR / "metrics.json"
REPORT_HTML = REPORTS_DIR / "report.html"


def clean_split_path(split: str, clean_dir: Path = CLEAN_DIR) -> Path:
    return clean_dir / f"{split}.txt"


SPLITS = ("train", "val", "test")


def raw_split_path(raw_dir: str | Path, split: str) -> Path:
    return Path(raw_dir) / SPLIT_FILES[split]
