"""Stage encode: token IDs of every clean split as .npy arrays + meta.json in data/encoded/."""

from minigpt.core.paths import ENCODED_DIR, SPLITS
from minigpt.core.provenance import Custody
from minigpt.core.stage import read_text, stage_main
from minigpt.data.encode import META_NAME, encode_splits, split_file
from minigpt.data.tokenizer_files import load_tokenizer


def run(params):
    custody = Custody("encode")
    tokenizer = load_tokenizer(custody.take("tokenizer"))
    texts = {split: read_text(custody.take(f"{split} text")) for split in SPLITS}
    meta = encode_splits(texts, tokenizer, ENCODED_DIR)
    custody.made(*(split_file(ENCODED_DIR, split) for split in SPLITS), ENCODED_DIR / META_NAME)
    custody.write()
    lengths = ", ".join(f"{s} {m['length']:,}" for s, m in meta["splits"].items())
    print(f"[encode] {meta['dtype']} IDs: {lengths}")


if __name__ == "__main__":
    raise SystemExit(stage_main("encode", run))
