"""Stage tokenizer: the vocabulary of clean train (`tokenizer.kind`: its characters + the placeholder, or byte-level
BPE learnt on it), round-trip checked on every split."""

from minigpt.core.errors import DataError
from minigpt.core.paths import SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.core.stage import read_text, stage_main
from minigpt.data.tokenizer_files import build_tokenizer


def run(params):
    texts = {split: read_text(clean_split_path(split)) for split in SPLITS}
    tokenizer = build_tokenizer(params.tokenizer, params.clean.placeholder, texts["train"])
    lengths = {}
    for split, text in texts.items():
        ids = tokenizer.encode(text)
        if tokenizer.decode(ids) != text:
            raise DataError(f"decode(encode(text)) differs from the clean {split} split")
        lengths[split] = len(ids)
    tokenizer.save(TOKENIZER_FILE)
    per_token = len(texts["val"]) / max(1, lengths["val"])
    print(f"[tokenizer] {params.tokenizer.kind}: {tokenizer.vocab_size} IDs, {per_token:.2f} characters per token on "
          f"val, fingerprint {tokenizer.fingerprint[:16]}…")


if __name__ == "__main__":
    raise SystemExit(stage_main("tokenizer", run))
