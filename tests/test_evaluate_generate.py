"""Full-split evaluation, sampling settings, repetition metrics, and the evaluate/generate stages."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose
from helpers.tiny_models import save_as_trained, small_config, train_quickly
from minigpt.core.config import CleanConfig
from minigpt.core.errors import ConfigError
from minigpt.data.textstats import (
    longest_char_run,
    longest_repeated_substring,
    repeated_ngram_share,
)
from minigpt.data.tokenizer import CharTokenizer
from minigpt.evaluate.generation import main as generate_main
from minigpt.evaluate.generation import prepare_prompt
from minigpt.evaluate.scoring import score_split, window_plan
from minigpt.model.checkpoint import save_checkpoint
from minigpt.model.gpt import MiniGPT
from minigpt.model.sampling import SamplingSettings, next_token_logits, sample_chunks, sample_text
from minigpt.report.run_files import load_run, workspace_reader
from minigpt.report.run_page import run_page


@pytest.mark.parametrize("n,block,stride", [(2, 8, 4), (9, 8, 8), (100, 8, 4), (101, 8, 3), (57, 16, 1), (20, 16, 16)])
def test_window_plan_scores_every_target_once_with_enough_context(n, block, stride):
    scored = []
    for start, first in window_plan(n, block, stride):
        window = min(block, n - 1)
        for j in range(first, window):
            scored.append(start + 1 + j)
            if start > 0:
                assert j + 1 >= block - stride, "each scored token has >= block_size - stride tokens of context"
    assert sorted(scored) == list(range(1, n))


def test_score_split_matches_a_token_by_token_computation():
    torch.manual_seed(0)
    model = MiniGPT(small_config(20, block_size=8, embedding_dim=16, num_heads=2, num_layers=1))
    ids = np.random.default_rng(0).integers(0, 20, size=61)
    result = score_split(model, ids, stride=3, batch_size=4, device=torch.device("cpu"))
    # brute force: each target t with the context the plan gives it
    total = 0.0
    with torch.no_grad():
        for start, first in window_plan(len(ids), 8, 3):
            window = torch.as_tensor(ids[start:start + 8 + 1], dtype=torch.long)
            logits, _ = model(window[None, :-1])
            nll = F.cross_entropy(logits[0], window[1:], reduction="none")
            total += float(nll[first:].sum())
    assert result["tokens"] == 60
    assert result["loss"] == pytest.approx(total / 60, rel=1e-6)
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2))
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert score_split(model, ids, 3, 4, torch.device("cpu")) == result, "deterministic"


def test_bf16_scoring_stays_close_to_fp32():
    """evaluate.precision defaults to bf16: same windows, losses summed in fp32, only the matmuls in bf16."""
    torch.manual_seed(0)
    model = MiniGPT(small_config(40, embedding_dim=64))
    ids = np.random.default_rng(1).integers(0, 40, size=2_000)
    fp32 = score_split(model, ids, 8, 16, torch.device("cpu"), "fp32")
    bf16 = score_split(model, ids, 8, 16, torch.device("cpu"), "bf16")
    assert bf16["tokens"] == fp32["tokens"] and bf16["bpc"] != fp32["bpc"], "bf16 must really be used"
    assert bf16["bpc"] == pytest.approx(fp32["bpc"], abs=0.01)


@pytest.mark.parametrize("settings,message", [
    (SamplingSettings(temperature=0), "temperature' = 0 is invalid; it must be a finite number > 0"),
    (SamplingSettings(top_k=0), "top_k' = 0 is invalid; it must be between 1 and the vocabulary size 30"),
    (SamplingSettings(top_k=31), "top_k' = 31 is invalid"),
    (SamplingSettings(top_p=0.0), "top_p' = 0.0 is invalid; it must be in (0, 1]"),
    (SamplingSettings(top_p=1.5), "top_p' = 1.5 is invalid"),
    (SamplingSettings(repetition_penalty=0.9), "repetition_penalty' = 0.9 is invalid; it must be a finite number >= 1"),
])
def test_invalid_sampling_settings_are_named(settings, message):
    with pytest.raises(ConfigError,
                       match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        settings.validate(30)


def test_top_p_keeps_the_smallest_nucleus_and_penalty_lowers_seen_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = next_token_logits(logits, torch.tensor([[0]]), SamplingSettings(top_p=0.8))
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    kept = next_token_logits(logits, torch.tensor([[0]]), SamplingSettings(top_p=0.1))
    assert torch.isfinite(kept).tolist() == [[True, False, False, False]]
    raw = torch.tensor([[2.0, 2.0, -1.0]])
    penalised = next_token_logits(raw, torch.tensor([[0, 2]]), SamplingSettings(repetition_penalty=2.0))
    assert penalised.tolist() == [[1.0, 2.0, -2.0]]


def test_repetition_metrics():
    assert repeated_ngram_share("abcdabcd", 4) == pytest.approx(1 - 4 / 5)
    assert repeated_ngram_share("abcdefgh", 4) == 0.0
    assert longest_repeated_substring("the cat and the hat") == 4  # "the "
    assert longest_repeated_substring("abcdef") == 0
    assert longest_repeated_substring("aaaa") == 3
    assert longest_char_run("abbbcc") == 3


def test_prompt_characters_outside_the_vocabulary_are_refused():
    tok = CharTokenizer.from_text("The cat\n", placeholder="\ufffd")
    clean = CleanConfig(unicode_form="NFC", min_char_count=1, placeholder="\ufffd", detokenize_markup=False)
    assert prepare_prompt("The", 0, tok, clean) == "The"
    with pytest.raises(ConfigError,
                       match=r"'generate.prompts\[2\]' = 'Thé' has characters outside the vocabulary: 'é' \(U\+00E9\)"):
        prepare_prompt("Thé", 2, tok, clean)


def test_evaluate_and_generate_stages_on_a_trained_checkpoint(project):
    root, source = project
    recompose(root, source, ["generate.max_new_tokens=40", "evaluate.dynamic=true", "evaluate.mixture_order=5"])
    model, tok = train_quickly(root, 250)
    save_as_trained(root, model, tok.fingerprint, best_step=250, elapsed_s=1.0)
    for stage in ("evaluate", "generate"):
        result = subprocess.run([sys.executable, str(REPO_ROOT / f"stages/{stage}.py")], cwd=root, capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        if stage == "evaluate":
            assert "[evaluate] dynamic evaluation: the model learns on each split while scoring it" in result.stdout
            assert "[evaluate] static mixture of the model with an n-gram counted on train" in result.stdout
    metrics = json.loads((root / "reports/evaluation.json").read_text())
    dynamic = metrics["dynamic"]  # its own key: the static figures are scored without it
    assert dynamic["label"].startswith("dynamic evaluation") and dynamic["lr"] == 1e-4
    assert all(dynamic[split]["tokens"] == metrics[split]["tokens"] for split in ("val", "test"))
    assert dynamic["val"]["bpc"] != metrics["val"]["bpc"]
    # the mixture: its own key too; its n-gram, counted on the encoded train split, is the baselines stage's 5-gram
    mixture, ladder = metrics["mixture"], {row["name"]: row for row in metrics["baselines"]["rows"]}
    assert mixture["order"] == 5 and 0 <= mixture["weight"] <= 1
    for split in ("val", "test"):
        assert mixture[split]["tokens"] == mixture["ngram"][split]["tokens"] == metrics[split]["tokens"]
        assert mixture["ngram"][split]["bpc"] == pytest.approx(ladder["5-gram Kneser-Ney"][split]["bpc"], rel=1e-9)
    # cross-fitted, the mixture is within a hair of the better side at worst (here the 5-gram: the model trained 250
    # steps on the fixture), and far better than the worse
    assert mixture["val"]["bpc"] < min(metrics["val"]["bpc"], mixture["ngram"]["val"]["bpc"]) + 0.01
    assert mixture["val"]["bpc"] < max(metrics["val"]["bpc"], mixture["ngram"]["val"]["bpc"]) - 0.1
    # the run page shows both under their own heading, apart from the ladder, with the figures evaluation.json holds
    html = run_page(load_run("w", workspace_reader(root)))
    figures = html.split('<table class="separate-figures">')[1].split("</table>")[0]
    ladder_table = html.split('<table class="baselines">')[1].split("</table>")[0]
    assert "dynamic evaluation" not in ladder_table and "model + 5-gram" not in ladder_table
    assert "dynamic evaluation (lr 0.0001)" in figures
    assert f"model + 5-gram (the n-gram's weight {1 - mixture['weight']:.3f})" in figures
    for split in ("val", "test"):
        for figure in (dynamic[split], mixture[split], mixture["ngram"][split]):
            assert f'{figure["bpc"]:.4f}' in figures
    val_len = len(np.load(root / "data/encoded/val.npy"))
    assert metrics["val"]["tokens"] == val_len - 1
    assert metrics["val"]["bpc"] < metrics["baseline_bpc"] - 0.5
    assert metrics["generalization_gap"] == pytest.approx(metrics["val"]["loss"] - metrics["train_slice"]["loss"])
    assert metrics["best_step"] == 250 and metrics["min_context"] == 32 - 16 + 1
    # the blocks behind the 95% interval: every scored target in exactly one block, summing to the split's figure
    blocks = json.loads((root / "reports/eval_blocks.json").read_text())
    assert (blocks["resamples"], blocks["seed"]) == (metrics["interval"]["resamples"], metrics["interval"]["seed"])
    for split in ("val", "test"):
        kept, m = blocks["splits"][split], metrics[split]
        assert len(kept["tokens"]) == metrics["interval"]["blocks"] == 200 and sum(kept["tokens"]) == m["tokens"]
        assert sum(kept["nll"]) / sum(kept["tokens"]) / math.log(2) == pytest.approx(m["bpc"], rel=1e-12)
        low, high = m["bpc_ci95"]
        assert low < m["bpc"] < high and high - low < 0.5
    assert blocks["splits"]["val"]["sha256"] == json.loads((root / "data/encoded/meta.json").read_text())[
        "splits"]["val"]["sha256"]
    generation = json.loads((root / "reports/generation.json").read_text())
    assert len(generation["samples"]) == 3 and all(len(s["text"]) == 40 for s in generation["samples"])
    assert {"repeated_4gram_share", "longest_repeated_substring"} <= set(generation["mean"])
    assert "## Prompt 1: 'The'" in (root / "reports/samples.md").read_text()


def test_untrained_checkpoint_is_an_error_not_a_metric(project):
    root, source = project
    recompose(root, source, [])
    model, tok = train_quickly(root, 0)
    save_as_trained(root, model, tok.fingerprint)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/evaluate.py")], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 1 and "does not beat the unigram baseline's" in result.stderr
    assert "Likely causes: the weights were not loaded or not trained" in result.stderr
    assert not (root / "reports/evaluation.json").exists()
    assert not (root / "reports/eval_blocks.json").exists()


def test_generation_refuses_bad_settings_and_a_tokenizer_mismatch(project, capsys):
    root, source = project
    recompose(root, source, [])
    model, tok = train_quickly(root, 0)
    save_checkpoint(root / "models/mini_gpt_best.pt", model, tok.fingerprint)
    args = ["--params", str(root / "params.yaml"), "--root", str(root), "--checkpoint",
            str(root / "models/mini_gpt_best.pt")]
    assert generate_main(["--prompt", "The", "--max-new-tokens", "5", *args]) == 0
    assert capsys.readouterr().out.startswith("The")
    assert generate_main(["--prompt", "The", "--top-k", "1000", *args]) == 1
    assert f"between 1 and the vocabulary size {tok.vocab_size}" in capsys.readouterr().err
    assert generate_main(["--prompt", "The", "--temperature", "0", *args]) == 1
    assert "temperature' = 0.0 is invalid" in capsys.readouterr().err
    save_checkpoint(root / "models/mini_gpt_best.pt", model, "0" * 64)
    assert generate_main(["--prompt", "The", *args]) == 1
    assert "trained with tokenizer 0000000000000000" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"'generate.top_p' = 0 is invalid; it must be in \(0, 1\]"):
        recompose(root, source, ["generate.top_p=0"])  # params.yaml itself is validated by the schema


@pytest.mark.parametrize("argv,message", [
    (["--prompt", ""], "'--prompt' is empty"),
    (["--prompt", "The", "--max-new-tokens", "-5"],
     "'--max-new-tokens' = -5 is invalid; it must be between 1 and 100000"),
    (["--prompt", "The", "--max-new-tokens", "1000000000000"], "'--max-new-tokens' = 1000000000000 is invalid"),
    (["--prompt", "The", "--temperature", "inf"], "'--temperature' = inf is invalid; it must be a finite number > 0"),
    (["--prompt", "The", "--top-p", "2"], "'--top-p' = 2.0 is invalid"),
])
def test_generation_cli_refuses_bad_options_by_their_own_names(project, capsys, argv, message):
    root, source = project
    recompose(root, source, [])
    model, tok = train_quickly(root, 0)
    save_checkpoint(root / "models/mini_gpt_best.pt", model, tok.fingerprint)
    args = ["--params", str(root / "params.yaml"), "--root", str(root), "--checkpoint",
            str(root / "models/mini_gpt_best.pt")]
    assert generate_main([*argv, *args]) == 1
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_generation_streams_pieces_that_join_to_one_call(project):
    root, source = project
    params = recompose(root, source, [])
    model, tok = train_quickly(root, 0)
    settings = SamplingSettings(0.8, 20, 0.95, 1.0)
    whole = sample_text(model, tok, "The", settings, 100, 7, torch.device("cpu"))
    pieces = list(sample_chunks(model, tok, "The", settings, 100, 7, torch.device("cpu"), chunk=32))
    assert [len(p) for p in pieces] == [32, 32, 32, 4] and "".join(pieces) == whole
    assert params.model.block_size < 100, "the pieces cross the context window's crop"


def _dynamic_fixture():
    from helpers.tiny_models import small_config
    from minigpt.model.gpt import MiniGPT

    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=12, block_size=16))
    pattern = torch.randint(0, 12, (50,))
    return model, pattern.repeat(40).numpy()  # 2000 tokens: one 50-token text over and over


def test_dynamic_evaluation_at_a_vanishing_lr_is_the_static_score_in_one_stream():
    from minigpt.evaluate.dynamic import dynamic_score

    model, ids = _dynamic_fixture()
    static = score_split(model, ids, 8, 4, torch.device("cpu"))
    dynamic = dynamic_score(model, ids, 8, 1, 1e-12, torch.device("cpu"))
    assert dynamic["tokens"] == static["tokens"] == len(ids) - 1, "every target scored exactly once"
    assert dynamic["loss"] == pytest.approx(static["loss"], rel=1e-5)


def test_dynamic_evaluation_learns_what_repeats_and_leaves_the_model_unchanged():
    from minigpt.evaluate.dynamic import dynamic_score, segment_bounds

    model, ids = _dynamic_fixture()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    static = score_split(model, ids, 8, 4, torch.device("cpu"))
    dynamic = dynamic_score(model, ids, 8, 2, 3e-3, torch.device("cpu"))
    assert dynamic["tokens"] == len(ids) - 1 and dynamic["streams"] == 2
    assert dynamic["bpc"] < static["bpc"] - 0.5, "a text read over and over is learned while it is scored"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the trained weights are untouched"
    bounds = segment_bounds(len(ids), 4, 16)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(ids) - 1
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "consecutive segments share one token"
    assert len(segment_bounds(40, 16, 16)) == 2, "a short split: fewer segments, each a full window"
