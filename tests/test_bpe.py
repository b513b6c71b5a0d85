"""The byte-level BPE tokenizer: exact round trips, characters per token for bits per character, a fingerprint that
is the hash of its canonical JSON, and the same refusals as the character tokenizer's file."""

import hashlib
import json

import numpy as np
import pytest

from minigpt.core.errors import DataError
from minigpt.data.bpe import BPETokenizer, canonical_json

SPECIAL = ["<|endoftext|>"]


@pytest.fixture(scope="module")
def bpe(fixture_texts):
    return BPETokenizer.train(fixture_texts["wiki.train.raw"], 300, SPECIAL)


def test_every_split_round_trips_and_its_characters_are_counted_once(bpe, fixture_texts):
    counts = bpe.char_counts()
    for split, text in fixture_texts.items():
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text, split
        assert int(counts[ids.astype(np.int64)].sum()) == len(text), split
        assert len(ids) < len(text), f"{split}: merges make tokens longer than a character"
    mixed = "naïve café — 日本語 😀 and a character train never saw: \u16a0"
    ids = bpe.encode(mixed)
    assert bpe.decode(ids) == mixed and int(counts[ids.astype(np.int64)].sum()) == len(mixed)


def test_the_vocabulary_is_the_bytes_the_special_tokens_and_merges(bpe):
    assert bpe.vocab_size == 300 and bpe.encode("x").dtype == np.uint16
    assert bpe.decode(bpe.encode(SPECIAL[0])) == SPECIAL[0]
    with pytest.raises(DataError, match=r"needs at least 256 \+ 1 special token"):
        BPETokenizer.train("abc", 200, SPECIAL)
    with pytest.raises(DataError, match=r"token IDs must be in \[0, 300\)"):
        bpe.decode([300])


def test_training_is_deterministic_and_the_fingerprint_hashes_the_canonical_json(bpe, fixture_texts):
    again = BPETokenizer.train(fixture_texts["wiki.train.raw"], 300, SPECIAL)
    assert again.fingerprint == bpe.fingerprint
    stored = json.dumps(bpe.to_dict()["tokenizer"], indent=3)  # whitespace and key order do not matter
    assert bpe.fingerprint == hashlib.sha256(canonical_json(stored).encode("utf-8")).hexdigest()
    assert BPETokenizer.train(fixture_texts["wiki.train.raw"], 301, SPECIAL).fingerprint != bpe.fingerprint


def test_the_file_round_trips_and_a_hand_edit_or_another_format_is_refused(bpe, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    assert BPETokenizer.load(path).fingerprint == bpe.fingerprint
    payload = json.loads(path.read_text())
    merges = payload["tokenizer"]["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match="does not match its vocabulary and merges.*edited by hand"):
        BPETokenizer.load(path)
    path.write_text(json.dumps({"format": "minigpt-char-tokenizer", "chars": ["a"]}))
    with pytest.raises(DataError, match="not a minigpt-bpe-tokenizer file"):
        BPETokenizer.load(path)
    path.write_text(json.dumps({**bpe.to_dict(), "tokenizer": {"model": "nonsense"}}))
    with pytest.raises(DataError, match="not a loadable BPE tokenizer"):
        BPETokenizer.load(path)


def test_bits_per_character_are_the_same_per_token_or_per_character_for_a_char_run(fixture_texts):
    """A character tokenizer holds one character per token: the per-character formula gives its figures bit for
    bit; a BPE run divides the same summed NLL by the characters its targets hold."""
    from helpers.blocks import block_sums
    from minigpt.data.tokenizer import CharTokenizer
    from minigpt.evaluate.intervals import bpc_interval, character_blocks
    from minigpt.evaluate.scoring import summarise, target_chars

    text = fixture_texts["wiki.valid.raw"]
    char = CharTokenizer.from_text(text)
    ids = char.encode(text)
    nll = np.random.default_rng(0).gamma(1.2, 1.3, size=len(ids) - 1)
    per_char = summarise(nll, target_chars(ids, char.char_counts()))
    assert per_char == {**summarise(nll), "characters": len(ids) - 1}
    assert per_char["bpc"] == float(nll.sum()) / len(nll) / np.log(2)
    sums, counts = block_sums(nll, 200)
    cut = character_blocks(nll, target_chars(ids, char.char_counts()), 1, 200)
    assert bpc_interval(cut["nll"], cut["chars"], 500, 0) == bpc_interval(sums, counts, 500, 0)

    bpe = BPETokenizer.train(fixture_texts["wiki.train.raw"], 300)
    ids = bpe.encode(text)
    nll = np.random.default_rng(0).gamma(1.2, 1.3, size=len(ids) - 1)
    chars = target_chars(ids, bpe.char_counts())
    first_token_chars = int(bpe.char_counts()[int(ids[0])])
    assert int(chars.sum()) == len(text) - first_token_chars, "every character but the unscored first token's"
    scored = summarise(nll, chars)
    assert scored["bpc"] == pytest.approx(nll.sum() / chars.sum() / np.log(2))
    assert scored["bpc"] < scored["loss"] / np.log(2), "a BPE token holds more than one character"
    cut = character_blocks(nll, chars, first_token_chars, 200)
    assert int(cut["chars"].sum()) == int(chars.sum()) and int(cut["tokens"].sum()) == len(nll)
    assert cut["nll"].sum() == pytest.approx(nll.sum(), rel=1e-12)


BPE_RUN = ["tokenizer=bpe", "tokenizer.vocab_size=300", "train.max_steps=40", "train.warmup_steps=5",
           "train.eval_every=10", "train.eval_batches=2", "train.sample_length=0", "generate.max_new_tokens=40"]


def test_a_bpe_run_goes_through_every_stage_and_is_scored_per_character(project):
    """tokenizer=bpe from the tokenizer stage to generate: uint16 IDs, preflight passes with the BPE vocabulary,
    the model is scored in bits per character against the character baselines; a tokenizer rebuilt with another
    vocabulary is refused by the gate, evaluate and generate, as the character tokenizer's is."""
    import subprocess
    import sys

    from helpers import REPO_ROOT
    from helpers.pipeline_fixture import recompose
    from minigpt.data.tokenizer_files import load_tokenizer

    root, source = project

    def stage(name, check=True):
        result = subprocess.run([sys.executable, str(REPO_ROOT / "stages" / f"{name}.py")], cwd=root,
                                capture_output=True, text=True)
        assert not check or result.returncode == 0, f"{name}: {result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        return result

    recompose(root, source, BPE_RUN)
    baselines = (root / "data/baselines/baselines.json").read_text()
    for name in ("tokenizer", "encode", "preflight", "train", "evaluate", "generate"):
        stage(name)
    tok = load_tokenizer(root / "data/tokenizer/tokenizer.json")
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 300
    meta = json.loads((root / "data/encoded/meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 300
    report = json.loads((root / "reports/debug_report.json").read_text())
    assert report["passed"], [c for c in report["checks"] if c["status"] == "failed"]
    evaluation = json.loads((root / "reports/evaluation.json").read_text())
    val_text = (root / "data/clean/val.txt").read_text(encoding="utf-8")
    val_ids = np.load(root / "data/encoded/val.npy")
    val = evaluation["val"]
    assert val["tokens"] == len(val_ids) - 1
    assert val["characters"] == len(val_text) - int(tok.char_counts()[int(val_ids[0])])
    assert val["bpc"] == pytest.approx(val["loss"] * val["tokens"] / val["characters"] / np.log(2), rel=1e-9)
    unigram = next(r for r in evaluation["baselines"]["rows"] if r["name"].startswith("unigram"))
    assert val["bpc"] < unigram["val"]["bpc"] < val["loss"] / np.log(2), "per character, not per token"
    assert (root / "data/baselines/baselines.json").read_text() == baselines, "the baselines stay per character"

    recompose(root, source, [*BPE_RUN[:1], "tokenizer.vocab_size=301", *BPE_RUN[2:]])
    stage("tokenizer")
    refused = {name: stage(name, check=False) for name in ("train", "evaluate", "generate")}
    assert "mismatched fingerprint" in refused["train"].stderr and "tokenizer" in refused["train"].stderr
    for name in ("evaluate", "generate"):
        assert refused[name].returncode != 0 and "IDs would map to the wrong characters" in refused[name].stderr, \
            refused[name].stderr
