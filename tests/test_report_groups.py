"""Seed groups: runs whose params differ only in their seeds are one setting trained several times; the tools show
the group's mean ± sd, draw its curves as a band, and compare groups with an interval that holds training noise
as well as text noise."""

import math

import numpy as np
import pytest

from helpers.blocks import block_sums
from helpers.browser import coloured_pixels, visit
from minigpt.evaluate.intervals import group_difference, paired_difference, student_t_quantile
from minigpt.report.__main__ import main
from minigpt.report.compare import compare_page
from minigpt.report.diff import diff_runs_text
from minigpt.report.groups import group_split, seed_groups
from minigpt.report.run_files import RunFiles

BLOCKS, RESAMPLES = 200, 500
TEXT = np.random.default_rng(3).gamma(1.2, 1.3, size=20_000)  # per-target NLLs of a "typical" model, nats


def trained(seed: int, quality: float, spread: float = 0.02) -> np.ndarray:
    """A run's per-target NLL: the text's difficulty, the setting's quality (nats), a seed's own offset and noise."""
    rng = np.random.default_rng(seed)
    return TEXT + quality + rng.normal(0, spread) + rng.normal(0, 0.05, size=TEXT.shape)


def block_rows(nlls) -> tuple[list[np.ndarray], np.ndarray]:
    cut = [block_sums(nll, BLOCKS) for nll in nlls]
    return [sums for sums, _ in cut], cut[0][1]


def run_of(name: str, nll: np.ndarray, lr: float, seed: int, preflight_seed: int = 1234) -> RunFiles:
    sums, counts = block_sums(nll, BLOCKS)
    kept = {"sha256": "abc", "tokens": counts.tolist(), "nll": sums.tolist()}
    bpc = float(nll.sum() / len(nll) / math.log(2))
    losses = [(step, 4.0 - step / 100 + nll.mean() + (seed % 3) * 0.05) for step in range(0, 200, 20)]
    return RunFiles(name=name, params={"train": {"lr": lr, "seed": seed}, "preflight": {"seed": preflight_seed}},
                    eval_blocks={"blocks": BLOCKS, "resamples": RESAMPLES, "seed": 0,
                                 "splits": {"val": kept, "test": kept}},
                    evaluation={"val": {"bpc": bpc}, "test": {"bpc": bpc}, "generalization_gap": 0.01},
                    train_log=[{"step": s, "train_loss": v, "val_loss": v, "lr": lr, "grad_norm": 1.0}
                               for s, v in losses])


def sweep(shift: float = 0.0) -> list[RunFiles]:
    """lr 1e-3 and 3e-3, three seeds each; 3e-3 better by `shift` nats."""
    return [run_of(f"lr{lr}-s{seed}", trained(seed * 10 + i, -shift * i), lr, seed)
            for i, lr in enumerate((1e-3, 3e-3)) for seed in (1, 2, 3)]


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (2, 4.303), (4, 2.776), (30, 2.042), (5000, 1.960)])
def test_the_t_quantile_matches_the_tables(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=0.001)


def test_identical_groups_differ_by_zero_with_an_interval_holding_zero():
    rows, tokens = block_rows([trained(s, 0.0) for s in (1, 2, 3)])
    result = group_difference(rows, [r.copy() for r in rows], tokens, RESAMPLES, 0)
    assert result["difference"] == 0.0 and result["ci95"][0] < 0 < result["ci95"][1]
    assert result["se_seeds"] > 0, "the seeds' spread is in the interval even when the means agree"


@pytest.mark.parametrize("shift_nats", [0.1, -0.1])  # five times the seeds' spread (0.02 nats)
def test_a_known_shift_between_groups_is_found_with_its_size_and_sign(shift_nats):
    a, tokens = block_rows([trained(s, 0.0) for s in (1, 2, 3)])
    b, _ = block_rows([trained(s + 100, shift_nats) for s in (1, 2, 3)])
    result = group_difference(a, b, tokens, RESAMPLES, 0)
    low, high = result["ci95"]
    assert (low > 0) if shift_nats > 0 else (high < 0), result
    assert result["difference"] == pytest.approx(shift_nats / math.log(2), abs=0.03)


def test_the_group_interval_holds_the_seed_noise_the_paired_run_interval_leaves_out():
    """No real difference between the settings (same quality, other seeds): comparing one run of each, the paired
    interval (text noise only) calls most pairs different; the group interval keeps close to its 95%."""
    run_calls = group_holds = 0
    trials = 60
    for trial in range(trials):
        a, tokens = block_rows([trained(1000 * trial + s, 0.0) for s in (1, 2, 3)])
        b, _ = block_rows([trained(1000 * trial + 500 + s, 0.0) for s in (1, 2, 3)])
        low, high = paired_difference(a[0], b[0], tokens, RESAMPLES, 0)["ci95"]
        run_calls += not (low <= 0 <= high)
        low, high = group_difference(a, b, tokens, RESAMPLES, 0)["ci95"]
        group_holds += low <= 0 <= high
    assert run_calls > trials / 2, run_calls
    assert group_holds >= 0.85 * trials, group_holds


def test_a_group_needs_two_seeds():
    rows, tokens = block_rows([trained(1, 0.0), trained(2, 0.0)])
    with pytest.raises(ValueError, match="at least two runs"):
        group_difference(rows[:1], rows, tokens, RESAMPLES, 0)
    runs = sweep()[:4]  # lr 1e-3 three times, 3e-3 once
    groups = seed_groups(runs)
    assert "a group needs two seeds or more" in group_split(groups[0], groups[1], "val")["verdict"]


def test_runs_differing_only_in_seeds_form_a_group_with_its_mean_and_spread():
    runs = sweep(0.1) + [run_of("other-preflight-seed", trained(77, 0.0), 1e-3, 4, preflight_seed=9)]
    groups = seed_groups(runs)
    assert [g.label for g in groups] == ["train.lr=0.001", "train.lr=0.003"]
    assert [len(g.runs) for g in groups] == [4, 3] and groups[0].seeds == [1, 2, 3, 4]
    values = [r.evaluation["val"]["bpc"] for r in groups[1].runs]
    summary = groups[1].summary("val")
    assert summary["n"] == 3 and summary["mean"] == pytest.approx(np.mean(values))
    assert summary["sd"] == pytest.approx(np.std(values, ddof=1))
    dropout = run_of("dropout", trained(5, 0.0), 1e-3, 2)
    dropout.params["model"] = {"dropout": 0.1}
    apart = seed_groups([runs[0], dropout])
    assert [g.label for g in apart] == ["model.dropout unset", "model.dropout=0.1"], "any other param parts them"


def test_the_diff_compares_groups_when_given_groups(tmp_path, capsys):
    text = diff_runs_text(sweep(0.1))
    assert "G1 train.lr=0.001: 3 runs (train.seed 1, 2, 3)" in text
    g2 = [line for line in text.splitlines() if line.startswith("G2  ")]
    assert len(g2) == 2 and all("B is better" in line for line in g2), text
    same = diff_runs_text(sweep(0.0))
    assert all("no detectable difference" in line for line in same.splitlines() if line.startswith("G2  ")), same
    two = diff_runs_text(sweep(0.1)[2:4])
    assert two.startswith("A = lr0.001-s3, B = lr0.003-s1") and "train.seed 3 -> 1" in two


def test_the_comparison_page_summarises_groups_and_draws_their_bands(tmp_path):
    html = compare_page(sweep(0.1))
    section = html.split("<h2>Seed groups</h2>")[1].split("<h2>")[0]
    assert "train.lr=0.001" in section and " ± " in section and "1, 2, 3" in section
    worse = next(row for row in section.split("<tr>") if "<td>train.lr=0.001</td>" in row and "interval" not in row
                 and "is worse" in row)
    assert worse.count("is worse") == 2
    assert "shaded from their lowest to their highest" in html
    path = tmp_path / "groups.html"
    path.write_text(html)
    seen = visit(path)
    assert seen.requests == [path.resolve().as_uri()] and seen.console_errors == []
    assert len(seen.chart_screenshots) == 4 and coloured_pixels(seen.chart_screenshots[1]) > 300
    banded = tinted_pixels(seen.chart_screenshots[1])
    flat = compare_page([run_of("one", trained(1, 0.0), 1e-3, 1), run_of("two", trained(2, 0.0), 3e-3, 1)])
    path.write_text(flat)
    assert banded > 2 * tinted_pixels(visit(path).chart_screenshots[1]) + 500, "the band shades the chart"


def tinted_pixels(png: bytes) -> int:
    """Pale coloured pixels (a band at 20% opacity), neither grey nor a full-strength line."""
    import io

    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    spread = pixels.max(axis=2) - pixels.min(axis=2)
    return int(((spread > 12) & (spread <= 60)).sum())


def test_the_cli_takes_more_than_two_runs(tmp_path, capsys):
    """Three copies of one run are one setting, not groups to compare: each is set against the first."""
    (tmp_path / "reports").mkdir()
    assert main(["--repo", str(tmp_path), "diff", "workspace", "workspace", "workspace"]) == 0
    out = capsys.readouterr().out
    assert out.count("A = workspace, B = workspace") == 2 and "G1" not in out


def test_groups_of_two_tokenizers_are_compared_over_their_character_blocks():
    runs = sweep(0.1)
    for run in runs:
        bpe = run.params["train"]["lr"] == 3e-3
        run.params["tokenizer"] = {"kind": "bpe" if bpe else "char"}
        run.eval_blocks["tokenizer"] = "bpe-fingerprint" if bpe else "char-fingerprint"
        kept = dict(run.eval_blocks["splits"]["val"], cut="characters", text_sha256="clean")
        if bpe:  # BPE tokens straddle a few edges: its blocks hold a few characters more or less
            kept["chars"] = [n + (1 if i % 2 else -1) for i, n in enumerate(kept["tokens"])]
        run.eval_blocks["splits"] = {"val": kept, "test": kept}
    groups = seed_groups(runs)
    compared = group_split(groups[0], groups[1], "val")
    assert compared["verdict"] == "B is better" and compared["ci95"][1] < 0, compared
    for run in runs:
        for kept in run.eval_blocks["splits"].values():
            kept.pop("cut", None)
    assert "different tokenizers" in group_split(groups[0], groups[1], "val")["verdict"]
