"""Stage tokenizer: the character vocabulary of clean train (+ the placeholder), round-trip checked."""

from minigpt.core.errors import DataError
from minigpt.core.paths import SPLITS, TOKENIZER_FILE, clean_split_path
from minigpt.core.stage import read_text, stage_main
from minigpt.data.tokenizer import CharTokenizer


def run(params):
    texts = {split: read_text(clean_split_path(split)) for split in SPLITS}
    tokenizer = CharTokenizer.from_text(texts["train"], placeholder=params.clean.placeholder)
    for split, text in texts.items():
        if tokenizer.decode(tokenizer.encode(text)) != text:
            raise DataError(f"decode(encode(text)) differs from the clean {split} split")
    tokenizer.save(TOKENIZER_FILE)
    print(f"[tokenizer] {tokenizer.vocab_size} characters, fingerprint {tokenizer.fingerprint[:16]}…")


if __name__ == "__main__":
    raise SystemExit(stage_main("tokenizer", run))
