"""The classical baselines: the Kneser-Ney n-gram against a brute-force count, its distributions summing to 1, the
unigram and the compressor figures by hand, the stage's ladder, and evaluate's use of it."""

import json
import lzma
import math
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import REPO_ROOT
from helpers.params_edits import refusal
from helpers.pipeline_fixture import recompose, record_as_written
from helpers.tiny_models import save_as_trained, train_quickly
from minigpt.evaluate.baselines import baseline_ladder, conditional_bits, ids_as_bytes, unigram_bits, xz
from minigpt.evaluate.ngram import kneser_ney_bits


def brute_force_kneser_ney(train, seq, vocab, order, discount):
    """The module docstring's formula with Python dicts: -log2 p of seq[1:], each target with the context it has."""
    raw = Counter(tuple(train[i - k + 1:i + 1]) for k in range(1, order + 1) for i in range(k - 1, len(train)))
    grams = {g for g in raw if len(g) >= 2}
    cont = Counter(g[1:] for g in grams)  # distinct tokens seen before each gram

    def prob(k, history, w, top):
        if k == 0:
            return 1.0 / vocab
        lower = prob(k - 1, history[1:], w, False)
        table = raw if top else cont
        row = [table.get(history + (x,), 0) for x in range(vocab)]
        total = sum(row)
        if total == 0:
            return lower
        return (max(row[w] - discount, 0) + discount * sum(c > 0 for c in row) * lower) / total

    bits = []
    for i in range(1, len(seq)):
        k = min(order, i + 1)
        bits.append(-math.log2(prob(k, tuple(seq[i - k + 1:i]), seq[i], k == order)))
    return np.array(bits)


def tiny_corpus(seed=0, vocab=6, n=400):
    rng = np.random.default_rng(seed)
    # a Markov chain, so the higher orders have something to find
    table = rng.dirichlet(np.full(vocab, 0.3), size=(vocab, vocab))
    seq = [0, 1]
    for _ in range(n - 2):
        seq.append(int(rng.choice(vocab, p=table[seq[-2], seq[-1]])))
    return np.array(seq)


@pytest.mark.parametrize("order,discount", [(1, 0.75), (2, 0.5), (3, 0.75), (5, 1.0)])
def test_kneser_ney_matches_a_brute_force_count_on_a_tiny_text(order, discount):
    vocab = 6
    train, val = tiny_corpus(0, vocab, 400), tiny_corpus(1, vocab, 120)
    val[50] = 5  # a rarely seen token, and unseen contexts around it
    got = kneser_ney_bits(train, {"val": val, "short": val[:3]}, vocab, [order], discount)[order]
    assert got["val"].shape == (len(val) - 1,) and got["short"].shape == (2,)
    np.testing.assert_allclose(got["val"], brute_force_kneser_ney(list(train), list(val), vocab, order, discount),
                               rtol=1e-10)
    np.testing.assert_allclose(got["short"], brute_force_kneser_ney(list(train), list(val[:3]), vocab, order, discount),
                               rtol=1e-10)


def test_kneser_ney_distributions_sum_to_one_over_the_vocabulary():
    vocab, order = 7, 4
    train = tiny_corpus(2, vocab, 600) % vocab
    train[train == 6] = 5  # token 6 is never seen in train: it must still get mass
    rng = np.random.default_rng(3)
    contexts = [list(rng.integers(0, vocab, size=length)) for length in (1, 2, 3, 3, 5, 8)] + [list(train[100:103])]
    splits = {f"{c}-{w}": np.array(ctx + [w]) for c, ctx in enumerate(contexts) for w in range(vocab)}
    bits = kneser_ney_bits(train, splits, vocab, [2, order], 0.75)
    for o in (2, order):
        for c in range(len(contexts)):
            probs = [2.0 ** -bits[o][f"{c}-{w}"][-1] for w in range(vocab)]
            assert sum(probs) == pytest.approx(1.0, abs=1e-12) and min(probs) > 0, (o, contexts[c])


def test_kneser_ney_refuses_bad_arguments():
    with pytest.raises(ValueError, match="discount must be in"):
        kneser_ney_bits(np.arange(5), {"v": np.arange(5)}, 5, [2], 1.5)
    with pytest.raises(ValueError, match="token IDs must be in"):
        kneser_ney_bits(np.arange(5), {"v": np.arange(6)}, 5, [2], 0.5)


def test_unigram_and_compressor_figures_by_hand():
    train, val = tiny_corpus(0, 6, 3000), tiny_corpus(1, 6, 500)
    counts = Counter(train.tolist())
    by_hand = sum(-math.log2((counts[t] + 1) / (len(train) + 6)) for t in val[1:])
    assert float(unigram_bits(train, val, 6).sum()) == pytest.approx(by_hand)
    t, v = bytes(train.astype(np.uint8)), bytes(val.astype(np.uint8))
    expected = 8 * (len(lzma.compress(t + v, preset=9 | lzma.PRESET_EXTREME))
                    - len(lzma.compress(t + v[:1], preset=9 | lzma.PRESET_EXTREME)))
    assert conditional_bits(xz, ids_as_bytes(train, 6), ids_as_bytes(val, 6), 1) == expected
    assert ids_as_bytes(np.array([1, 300]), 301) == bytes([1, 0, 44, 1]), "two little-endian bytes past 256"


def test_the_stage_writes_the_ladder_on_exactly_the_scored_targets(project):
    root, _ = project
    ladder = json.loads((root / "data/baselines/baselines.json").read_text())
    val = np.load(root / "data/encoded/val.npy")
    names = [r["name"] for r in ladder["rows"]]
    assert names == ["uniform", "unigram (add-one)", "3-gram Kneser-Ney", "5-gram Kneser-Ney", "7-gram Kneser-Ney",
                     "9-gram Kneser-Ney", "xz (lzma 9e)", "PPMd order 8"]
    assert all(r["val"]["tokens"] == len(val) - 1 for r in ladder["rows"])
    assert ladder["rows"][0]["val"]["bpc"] == pytest.approx(math.log2(ladder["vocab_size"]))
    static = [r for r in ladder["rows"] if r["kind"] == "static"]
    assert ladder["best_static"] == min(static, key=lambda r: r["val"]["bpc"])["name"]
    assert [r["kind"] for r in ladder["rows"]][-2:] == ["adaptive", "adaptive"]
    # the same numbers as the library computes directly
    cfg = SimpleNamespace(ngram_orders=[5], discount=0.9, ppmd_order=0, ppmd_mem_mb=16)
    again = baseline_ladder(root / "data/clean", "\ufffd", cfg)
    assert again["rows"][2]["val"]["bpc"] == pytest.approx(ladder["rows"][3]["val"]["bpc"])
    assert [r["name"] for r in again["rows"]] == ["uniform", "unigram (add-one)", "5-gram Kneser-Ney", "xz (lzma 9e)"]


def test_evaluate_refuses_baselines_of_other_data(project):
    root, source = project
    recompose(root, source, [])
    model, tok = train_quickly(root, 250)
    save_as_trained(root, model, tok.fingerprint, best_step=250, elapsed_s=1.0)
    path = root / "data/baselines/baselines.json"
    ladder = json.loads(path.read_text())
    ladder["data"]["val"] = "0" * 64
    path.write_text(json.dumps(ladder))
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/evaluate.py")], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 1, "edited after the baselines stage wrote it: its provenance record disagrees"
    assert "stage 'evaluate' was about to read its baselines, but the file is not the one stage 'baselines' " \
           "recorded writing" in result.stderr
    # a ladder the baselines stage itself wrote for other data (its record agrees): evaluate's own check refuses it
    record_as_written(root, "baselines", path)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/evaluate.py")], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert ("data/baselines/baselines.json: computed for other data (clean val changed since); "
            "run `dvc repro baselines`") in result.stderr
    path.write_text(json.dumps({"rows": [], "data": {}}))
    record_as_written(root, "baselines", path)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/evaluate.py")], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 1
    assert "baselines.json: not a baselines report (needs 'rows' with the unigram" in result.stderr
    path.unlink()
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/evaluate.py")], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 1 and "baselines.json: not found, so stage 'evaluate' cannot read its baselines; " \
                                      "run `dvc repro baselines`" in result.stderr
    assert not (root / "reports/evaluation.json").exists()



@pytest.mark.parametrize("key,value,message", [
    ("ngram_orders", [], "'baselines.ngram_orders' = [] is invalid; it must be a non-empty list of orders in [1, 16]"),
    ("ngram_orders", [3, 0], "'baselines.ngram_orders' = [3, 0] is invalid"),
    ("discount", 0.0, "'baselines.discount' = 0.0 is invalid; it must be in (0, 1]"),
    ("ppmd_order", 1, "'baselines.ppmd_order' = 1 is invalid; it must be 0 (off) or in [2, 64]"),
])
def test_baseline_settings_are_validated_by_name(key, value, message):
    assert message in refusal("baselines", key, value)
