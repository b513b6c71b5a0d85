"""Stage encode: token IDs of every clean split as .npy arrays + meta.json in data/encoded/."""

from minigpt.core.paths import ENCODED_DIR, SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.core.stage import read_text, stage_main
from minigpt.data.encode import encode_splits
from minigpt.data.tokenizer_files import load_tokenizer


def run(params):
    tokenizer = load_tokenizer(TOKENIZER_FILE)
    texts = {split: read_text(clean_split_path(split)) for split in SPLITS}
    meta = encode_splits(texts, tokenizer, ENCODED_DIR)
    lengths = ", ".join(f"{s} {m['length']:,}" for s, m in meta["splits"].items())
    print(f"[encode] {meta['dtype']} IDs: {lengths}")


if __name__ == "__main__":
    raise SystemExit(stage_main("encode", run))
