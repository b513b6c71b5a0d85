"""Stage clean: normalise data/raw/ into data/clean/{train,val,test}.txt; report in reports/clean.json."""

from minigpt.core.io_utils import atomic_directory, atomic_write_json
from minigpt.core.paths import CLEAN_DIR, CLEAN_REPORT, SPLITS, clean_split_path
from minigpt.core.provenance import Custody
from minigpt.core.stage import read_text, stage_main
from minigpt.data.clean import clean_splits


def run(params):
    custody = Custody("clean")
    raw = {split: read_text(custody.take(f"raw {split}")) for split in SPLITS}
    cleaned, report = clean_splits(raw, params.clean)
    with atomic_directory(CLEAN_DIR) as tmp:
        for split, text in cleaned.items():
            clean_split_path(split, tmp).write_bytes(text.encode("utf-8"))
    atomic_write_json(CLEAN_REPORT, report)
    custody.made(*(clean_split_path(split) for split in SPLITS))
    custody.write()
    replaced = ", ".join(f"{s} {r['replaced']}" for s, r in report["splits"].items())
    print(f"[clean] vocabulary {report['vocab_size']} characters; replaced by placeholder: {replaced}")


if __name__ == "__main__":
    raise SystemExit(stage_main("clean", run))
