"""`python -m minigpt.report diff A B`: B - A per split with a paired 95% interval and a verdict, refused when the
runs did not score the same blocks of the same text."""

import json
import math

import numpy as np
import pytest

from helpers.blocks import block_sums
from minigpt.report.__main__ import main
from minigpt.report.compare import compare_page
from minigpt.report.diff import diff_text
from minigpt.report.paired import paired_split
from minigpt.report.run_files import RunFiles


def blocks_of(nll: np.ndarray, sha: str = "abc") -> dict:
    sums, counts = block_sums(nll, 200)
    return {"blocks": 200, "splits": {s: {"sha256": sha, "tokens": counts.tolist(), "nll": sums.tolist()}
                                      for s in ("val", "test")}}


def run(name: str, nll: np.ndarray, lr: float = 1e-3, sha: str = "abc") -> RunFiles:
    return RunFiles(name=name, params={"train": {"lr": lr}}, eval_blocks=blocks_of(nll, sha))


BASE = np.random.default_rng(3).gamma(1.2, 1.3, size=30_000)
NOISE = np.random.default_rng(4).normal(0, 0.05, size=BASE.shape)


def test_a_better_run_a_worse_run_and_no_difference():
    a = run("a", BASE)
    better = paired_split(a, run("b", BASE - 0.02 + NOISE, lr=3e-3), "val")
    assert better["verdict"] == "B is better" and better["ci95"][1] < 0
    assert abs(better["difference"] - (better["b"] - better["a"])) < 1e-12
    assert abs(better["difference"] + 0.02 / math.log(2)) < 0.002
    assert paired_split(a, run("b", BASE + 0.02 + NOISE), "val")["verdict"] == "B is worse"
    same = paired_split(a, run("b", BASE.copy()), "test")
    assert same["difference"] == 0.0 and same["verdict"] == "no detectable difference"
    text = diff_text(a, run("b", BASE - 0.02 + NOISE, lr=3e-3))
    assert "B is better" in text and "train.lr 0.001 -> 0.003" in text


def test_runs_on_other_text_or_without_blocks_are_not_compared():
    a = run("a", BASE)
    assert "different text" in paired_split(a, run("b", BASE, sha="other"), "val")["verdict"]
    assert "no reports/eval_blocks.json for b" in paired_split(a, RunFiles(name="b"), "val")["verdict"]


def test_the_cli_compares_the_workspace_with_itself(tmp_path, capsys):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/eval_blocks.json").write_text(json.dumps(blocks_of(BASE)))
    assert main(["--repo", str(tmp_path), "diff", "workspace", "workspace"]) == 0
    out = capsys.readouterr().out
    assert out.count("no detectable difference") == 2 and "+0.0000" in out and "params that differ: none" in out


def test_the_comparison_page_sets_every_run_against_the_best_one():
    def evaluated(name, nll, lr):
        r = run(name, nll, lr)
        bpc = float(nll.sum() / len(nll) / math.log(2))
        r.evaluation = {"val": {"bpc": bpc}, "test": {"bpc": bpc}, "generalization_gap": 0.01}
        r.train = {"best_step": 10, "train_seconds": 5.0, "tokens_per_sec_median": 1000.0}
        return r

    runs = [evaluated("worse", BASE + 0.02 + NOISE, 1e-3), evaluated("best", BASE, 3e-3),
            evaluated("same", BASE.copy(), 1e-2)]
    html = compare_page(runs)
    section = html.split("Against the best run, paired")[1].split("<h2>")[0]
    assert "the best val bpc (best)" in section
    worse_row = next(row for row in section.split("<tr>") if "<td>worse</td>" in row)
    same_row = next(row for row in section.split("<tr>") if "<td>same</td>" in row)
    assert worse_row.count("is worse") == 2 and same_row.count("no detectable difference") == 2
    assert "<td>best</td>" not in section


def test_the_comparison_resamples_as_the_runs_evaluation_did():
    a, b = run("a", BASE), run("b", BASE - 0.02 + NOISE)
    default = paired_split(a, b, "val")
    a.eval_blocks = {**a.eval_blocks, "resamples": 500, "seed": 9}
    recorded = paired_split(a, b, "val")
    assert recorded["difference"] == default["difference"] and recorded["ci95"] != default["ci95"]
    assert "500 resamples" in diff_text(a, b)


def test_runs_of_different_tokenizers_are_not_compared_block_by_block():
    a, b = run("a", BASE), run("b", BASE + 0.02)
    a.eval_blocks["tokenizer"], b.eval_blocks["tokenizer"] = "char-fingerprint", "bpe-fingerprint"
    unpaired = paired_split(a, b, "val")
    assert "different tokenizers" in unpaired["verdict"] and unpaired["b"] > unpaired["a"]
    assert "different tokenizers" in diff_text(a, b) and f"{unpaired['b']:.4f}" in diff_text(a, b)
    b.eval_blocks["tokenizer"] = "char-fingerprint"
    assert paired_split(a, b, "val")["verdict"] == "B is worse"


def test_runs_of_different_tokenizers_are_paired_over_their_character_blocks():
    a, b = run("a", BASE), run("b", BASE + 0.02 + NOISE)
    a.eval_blocks["tokenizer"], b.eval_blocks["tokenizer"] = "char-fingerprint", "bpe-fingerprint"
    for blocks in (a.eval_blocks, b.eval_blocks):
        for kept in blocks["splits"].values():
            kept.update(cut="characters", text_sha256="clean-val")
    b_chars = b.eval_blocks["splits"]["val"]["chars"] = list(b.eval_blocks["splits"]["val"]["tokens"])
    b_chars[0] -= 2  # B's first token held three characters: the edges of its blocks differ by a few characters
    paired = paired_split(a, b, "val")
    assert paired["verdict"] == "B is worse" and paired["ci95"][0] > 0, paired
    assert paired["difference"] == pytest.approx(paired["b"] - paired["a"], abs=1e-12)
    assert "[+" in diff_text(a, b)
    b.eval_blocks["splits"]["val"]["text_sha256"] = "other-clean-val"
    assert "different text" in paired_split(a, b, "val")["verdict"]
