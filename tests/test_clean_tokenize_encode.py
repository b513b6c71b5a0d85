import hashlib
import json

import numpy as np
import pytest
import torch

from minigpt.core.config import CleanConfig
from minigpt.core.errors import DataError
from minigpt.data.clean import clean_splits
from minigpt.data.encode import encode_splits, ids_dtype, load_ids, load_meta, load_split
from minigpt.data.tokenizer import CharTokenizer, fingerprint_of

PH = "\ufffd"


def cfg(**overrides):
    base = dict(unicode_form="NFC", min_char_count=1, placeholder=PH, detokenize_markup=False)
    return CleanConfig(**{**base, **overrides})


def splits(fixture_texts):
    return {"train": fixture_texts["wiki.train.raw"], "val": fixture_texts["wiki.valid.raw"],
            "test": fixture_texts["wiki.test.raw"]}


def test_unseen_val_test_characters_become_the_placeholder(fixture_texts):
    cleaned, report = clean_splits(splits(fixture_texts), cfg())
    train_chars = set(cleaned["train"]) | {PH}
    for split in ("val", "test"):
        assert set(cleaned[split]) <= train_chars
        assert report["splits"][split]["replaced"] > 0
    replaced = [r["char"] for split in ("val", "test") for r in report["splits"][split]["most_replaced"]]
    assert "東" in replaced
    assert report["splits"]["train"]["replaced"] == 0
    assert report["vocab_size"] == len(train_chars)


def test_rare_train_characters_are_replaced_everywhere():
    raw = {"train": "aaab b c\n\n", "val": "abc\n", "test": "cab\n"}
    cleaned, report = clean_splits(raw, cfg(min_char_count=2))
    assert cleaned == {"train": f"aaab b {PH}\n\n", "val": f"ab{PH}\n", "test": f"{PH}ab\n"}
    assert report["splits"]["train"]["most_replaced"] == [{"char": "c", "codepoint": "U+0063", "count": 1}]
    assert report["splits"]["train"]["vocab_in"] == 5 and report["splits"]["train"]["vocab_out"] == 5


def test_line_endings_and_unicode_are_normalised():
    decomposed = "cafe\u0301"  # e + combining acute
    raw = {"train": f"{decomposed}\r\nx\ry\n", "val": "x\n", "test": "y\n"}
    cleaned, _ = clean_splits(raw, cfg())
    assert cleaned["train"] == "caf\u00e9\nx\ny\n"
    untouched, _ = clean_splits(raw, cfg(unicode_form="none"))
    assert "\u0301" in untouched["train"]


def test_markup_is_kept_by_default_and_detokenized_on_request():
    raw = {"train": "a 1 @,@ 000 b @-@ c 2 @.@ 5\n", "val": "a\n", "test": "b\n"}
    kept, _ = clean_splits(raw, cfg())
    assert kept["train"] == raw["train"]
    plain, _ = clean_splits(raw, cfg(detokenize_markup=True))
    assert plain["train"] == "a 1,000 b-c 2.5\n"


def test_tokenizer_is_sorted_and_fingerprinted(fixture_texts):
    cleaned, _ = clean_splits(splits(fixture_texts), cfg())
    tok = CharTokenizer.from_text(cleaned["train"], placeholder=PH)
    assert tok.chars == sorted(set(cleaned["train"]) | {PH})
    expected = hashlib.sha256(json.dumps(tok.chars, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    assert tok.fingerprint == expected == fingerprint_of(tok.chars)
    for text in cleaned.values():
        assert tok.decode(tok.encode(text)) == text


def test_encode_names_the_first_unknown_character():
    tok = CharTokenizer.from_text("abc ")
    with pytest.raises(DataError, match=r"character 'Z' \(U\+005A\) at position 4 is not in the tokenizer"):
        tok.encode("abc Zq")


def test_encode_matches_a_per_character_lookup():
    """Every character through the code-point table, characters beyond U+FFFF included."""
    text = "Zürich 東京 \U0001D518 naïve\n" * 50_000
    tok = CharTokenizer.from_text(text)
    stoi = {ch: i for i, ch in enumerate(tok.chars)}
    for sample in (text[:20], text):
        ids = tok.encode(sample)
        assert ids.dtype == np.uint8 and ids.tolist() == [stoi[ch] for ch in sample]
        assert tok.decode(ids) == sample
    bmp_only = CharTokenizer.from_text("ab\uffff")
    with pytest.raises(DataError, match=r"character '\U0001d518' \(U\+1D518\) at position 2"):
        bmp_only.encode("ab\U0001D518")  # a character beyond U+FFFF is one character, never two halves


def test_tokenizer_file_round_trip_and_hand_edit_refused(tmp_path):
    tok = CharTokenizer.from_text("hello world\n", placeholder=PH)
    path = tmp_path / "tok.json"
    tok.save(path)
    loaded = CharTokenizer.load(path)
    assert loaded.chars == tok.chars and loaded.fingerprint == tok.fingerprint
    payload = json.loads(path.read_text())
    payload["chars"][0], payload["chars"][1] = payload["chars"][1], payload["chars"][0]
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match="edited by hand"):
        CharTokenizer.load(path)


def test_ids_use_the_smallest_dtype():
    assert ids_dtype(2) == np.uint8 and ids_dtype(256) == np.uint8
    assert ids_dtype(257) == np.uint16 and ids_dtype(65536) == np.uint16


def test_encoded_splits_are_compact_memory_maps_with_metadata(tmp_path, fixture_texts):
    cleaned, _ = clean_splits(splits(fixture_texts), cfg())
    tok = CharTokenizer.from_text(cleaned["train"], placeholder=PH)
    meta = encode_splits(cleaned, tok, tmp_path / "encoded")
    assert load_meta(tmp_path / "encoded") == meta
    assert meta["tokenizer_fingerprint"] == tok.fingerprint and meta["dtype"] == "uint8"
    for split, text in cleaned.items():
        ids = load_ids(tmp_path / "encoded", split)
        assert isinstance(ids, np.memmap) and ids.dtype == np.uint8 and len(ids) == len(text)
        written = (tmp_path / "encoded" / f"{split}.npy").read_bytes()
        assert meta["splits"][split]["sha256"] == hashlib.sha256(written).hexdigest()
        tensor = load_split(tmp_path / "encoded", split)
        assert tensor.dtype == torch.long
        assert tok.decode(tensor.numpy()) == text


def test_wide_vocabulary_is_stored_as_uint16(tmp_path):
    text = "".join(chr(0x4E00 + i) for i in range(300))
    tok = CharTokenizer.from_text(text)
    meta = encode_splits({"train": text, "val": text[:10], "test": text[-10:]}, tok, tmp_path / "enc")
    assert meta["dtype"] == "uint16"
    assert load_ids(tmp_path / "enc", "train").max() == 299


@pytest.mark.parametrize("content",
                         ["null", "[]", '{"splits": {}}', '{"tokenizer_fingerprint": "f", "splits": {"train": 3}}'])
def test_meta_json_of_the_wrong_shape_is_named(tmp_path, content):
    (tmp_path / "meta.json").write_text(content)
    with pytest.raises(DataError, match=r"meta.json: not an encode metadata file .* run `dvc repro encode`"):
        load_meta(tmp_path)


@pytest.mark.parametrize("content", ["null", "[1, 2]", '{"format": "minigpt-char-tokenizer", "chars": "abc"}'])
def test_tokenizer_json_of_the_wrong_shape_is_named(tmp_path, content):
    (tmp_path / "tok.json").write_text(content)
    with pytest.raises(DataError, match=r"tok.json: not a minigpt-char-tokenizer file"):
        CharTokenizer.load(tmp_path / "tok.json")


def test_a_real_full_disk_during_encode_leaves_the_previous_splits_and_one_line(project):
    """data/ on a small tmpfs with no space left: encode's outputs cannot be written; the stage says which
    output and why in one line, exits non-zero, and the encoded splits of the last run stay as they were."""
    import subprocess
    import sys

    from helpers import REPO_ROOT
    from helpers.filesystems import fill, small_disk

    root, _source = project
    data = root / "data"
    with small_disk(data, spare_bytes=0):
        before = {p.name: p.read_bytes() for p in (data / "encoded").iterdir()}
        fill(data)
        result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/encode.py")], cwd=root, capture_output=True,
                                text=True)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == ("[encode] error: data/encoded: could not write it (No space left on device); "
                                         "the previous one is left as it was and nothing half-written remains. Free "
                                         "disk space or fix the folder's permissions, then rerun.")
        assert {p.name: p.read_bytes() for p in (data / "encoded").iterdir()} == before
        assert not list(data.glob(".encoded.*.tmp"))
