"""Soft targets (stage soft_targets) and training towards them (train.distill_alpha): the n-gram's distributions are
Kneser-Ney's, held out of their own fold, stored without pickle and refused for other data; the loss mixes them in;
preflight's three checks catch targets for other data, targets that saw their own fold, and misaligned targets."""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.pipeline_fixture import recompose, run_stage
from helpers.tiny_models import small_config
from minigpt.core.errors import ConfigError, DataError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.data import soft_target_files
from minigpt.data.encode import load_ids
from minigpt.data.soft_target_files import SoftTargets, build_soft_targets, load_soft_targets
from minigpt.data.soft_targets import count_ngrams, crossfit_soft_targets, heldout_topk
from minigpt.evaluate.ngram import kneser_ney_bits
from minigpt.model import batch_loss
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.checks import format_table
from minigpt.preflight.suite import run_preflight
from minigpt.train import distill, train_step
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train

DISTILL = ["soft_targets.order=3", "train.distill_alpha=0.3"]
FAST = ["train.max_steps=30", "train.eval_every=10", "train.eval_batches=2", "train.sample_length=0"]


def ids_of(text: str) -> tuple[np.ndarray, int]:
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return np.array([index[c] for c in text]), len(chars)


@pytest.fixture(scope="module")
def corpus(fixture_texts):
    return ids_of(fixture_texts["wiki.train.raw"][:30_000])


@pytest.mark.parametrize("order", [1, 2, 4, 6])
def test_heldout_distribution_scores_each_target_as_kneser_ney_does(corpus, order):
    text, vocab = corpus
    counted, scored = text[:20_000], text[20_000:]
    _ids, probs, bits, kept = heldout_topk(count_ngrams(counted, vocab, order), scored, np.arange(1, len(scored)),
                                           8, 0.9)
    reference = kneser_ney_bits(counted, {"s": scored}, vocab, [order], 0.9)[order]["s"]
    np.testing.assert_allclose(bits, reference, rtol=0, atol=1e-9)
    assert np.allclose(probs.sum(1), 1, atol=1e-5) and (kept <= 1 + 1e-9).all() and (kept > 0).all()


def test_a_fold_is_predicted_without_its_own_text(corpus):
    """A string that occurs only in fold 0: the in-sample n-gram has learned its continuation, the cross-fitted
    targets of fold 0 have not (they only back off to what the other folds know)."""
    text, vocab = corpus
    text = text.copy()
    rare_a, rare_b = vocab, vocab + 1  # two new symbols, always "a b", only inside fold 0
    for start in range(100, len(text) // 5 - 100, 400):
        text[start], text[start + 1] = rare_a, rare_b
    vocab += 2
    after_a = np.flatnonzero(text[:-1] == rare_a) + 1  # positions whose token is rare_b
    ids, probs, _bits, _kept = crossfit_soft_targets(text, vocab, 3, 5, 8, 0.9)
    in_sample_ids, in_sample_probs, _b, _k = heldout_topk(count_ngrams(text, vocab, 3), text, after_a, 8, 0.9)
    crossfit_mass = (probs[after_a] * (ids[after_a] == rare_b)).sum(1).mean()
    in_sample_mass = (in_sample_probs * (in_sample_ids == rare_b)).sum(1).mean()
    assert in_sample_mass > 0.8 and crossfit_mass < 0.05


def test_targets_are_stored_without_pickle_and_refused_for_other_data(project):
    root, source = project
    recompose(root, source, ["soft_targets.order=3"])
    summary = build_soft_targets(root / ENCODED_DIR, root / SOFT_TARGETS_DIR, 3, 8, 5, 0.9)
    soft = load_soft_targets(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)
    train_ids = load_ids(root / ENCODED_DIR, "train")
    assert soft.ids.shape == soft.probs.shape == (len(train_ids), 8) and soft.probs.dtype == torch.float16
    assert 1.0 < summary["bits_per_token"] < 4.0 and 0.5 < summary["kept_mass"] <= 1.0
    with np.load(root / SOFT_TARGETS_DIR / "targets.npz", allow_pickle=False) as arrays:
        assert arrays["ids"].dtype == np.uint8 and arrays["probs"].dtype == np.float16
    meta = json.loads((root / ENCODED_DIR / "meta.json").read_text())
    meta["splits"]["train"]["sha256"] = "0" * 64  # train encoded anew (another tokenizer, other data)
    (root / ENCODED_DIR / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="built from another encoded train.*dvc repro soft_targets"):
        load_soft_targets(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)


def test_order_0_builds_only_a_summary_that_training_refuses(project):
    root, _source = project
    build_soft_targets(root / ENCODED_DIR, root / SOFT_TARGETS_DIR, 0, 16, 5, 0.9)
    assert sorted(p.name for p in (root / SOFT_TARGETS_DIR).iterdir()) == ["summary.json"]
    with pytest.raises(DataError, match="soft_targets.order 0"):
        load_soft_targets(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)


def test_distillation_without_targets_is_a_config_error(project):
    root, source = project
    with pytest.raises(ConfigError, match="'train.distill_alpha' = 0.3 needs soft targets.*soft_targets.order"):
        recompose(root, source, ["train.distill_alpha=0.3"])


def test_soft_cross_entropy_and_the_mixed_objective():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    ids = torch.tensor([[[1, 2], [0, 4], [3, 3]], [[2, 1], [4, 0], [1, 3]]])
    probs = torch.tensor([[[0.75, 0.25], [1.0, 0.0], [0.5, 0.5]], [[0.6, 0.4], [0.1, 0.9], [0.3, 0.7]]])
    dense = torch.zeros(2, 3, 5).scatter_add_(-1, ids, probs)
    expected = -(dense * F.log_softmax(logits, -1)).sum(-1).mean()
    assert float(distill.soft_cross_entropy(logits, (ids, probs))) == pytest.approx(float(expected), rel=1e-6)


def test_draw_batch_gives_each_target_its_own_positions_soft_target():
    data = torch.arange(100)
    soft = SoftTargets(torch.arange(100)[:, None].repeat(1, 2), torch.full((100, 2), 0.5, dtype=torch.float16), {})
    inputs, targets, (ids, probs, rest) = distill.draw_batch(data, 4, 8, "cpu", torch.Generator().manual_seed(0), soft)
    assert rest.shape == targets.shape
    assert torch.equal(ids[..., 0], targets) and torch.equal(inputs[:, 1:], targets[:, :-1])
    plain = distill.draw_batch(data, 4, 8, "cpu", torch.Generator().manual_seed(0), None)
    assert plain[2] is None and torch.equal(plain[0], inputs)  # the same windows: the same random stream


def test_a_distilled_run_passes_preflight_and_trains_towards_the_targets(project):
    root, source = project
    params = recompose(root, source, DISTILL + FAST)
    run_stage(root, "soft_targets")
    report = run_preflight(params, root)
    assert report["passed"], format_table(report["checks"])
    checks = {c["name"]: c["measured"] for c in report["checks"]}
    assert checks["soft_targets"]["used"] and checks["soft_targets_held_out"]["max_abs_difference"] < 1e-3
    aligned = checks["soft_targets_aligned"]
    assert aligned["mass_on_targets"] > 2 * max(aligned["mass_on_inputs"], aligned["mass_on_next_target"])
    distilled = train(params, root, out=lambda _m: None)
    distilled_weights = torch.load(root / "models/mini_gpt_latest.pt", weights_only=True)["model_state_dict"]
    # the same run without the soft targets: same batches, other weights (the term reaches the gradients)
    shutil.rmtree(root / "models")
    plain_params = recompose(root, source, ["soft_targets.order=3"] + FAST)
    plain = train(plain_params, root, require_gate=False, out=lambda _m: None)
    plain_weights = torch.load(root / "models/mini_gpt_latest.pt", weights_only=True)["model_state_dict"]
    assert distilled["steps"] == plain["steps"] == 30
    assert any(not torch.equal(distilled_weights[k], plain_weights[k]) for k in plain_weights)


def test_the_step_minimises_the_mixed_objective_and_reports_the_one_hot_loss():
    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=12, block_size=8))
    inputs, targets = torch.randint(0, 12, (4, 8)), torch.randint(0, 12, (4, 8))
    soft = (torch.randint(0, 12, (4, 8, 3)), torch.full((4, 8, 3), 1 / 3))
    one_hot = float(batch_loss.calc_loss_batch(model, inputs, targets).detach())
    objective, loss = distill.distilled_loss(model, inputs, targets, soft, 0.4, "fp32")
    assert float(loss) == pytest.approx(one_hot, rel=1e-6)
    logits, _ = model(inputs, targets)
    mixed = 0.6 * one_hot + 0.4 * float(distill.soft_cross_entropy(logits, soft))
    assert float(objective) == pytest.approx(mixed, rel=1e-6) and abs(float(objective) - one_hot) > 1e-3
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = train_step.training_step(model, optimizer, inputs, targets, 0.1, "fp32", 1e9, soft=soft,
                                      distill_alpha=0.4)
    assert result.stepped and result.loss == pytest.approx(one_hot, rel=1e-6)


def test_targets_that_saw_their_own_fold_fail_soft_targets_held_out(project, monkeypatch):
    root, source = project
    params = recompose(root, source, DISTILL)
    # the planted bug: every fold counted together with the text it predicts
    monkeypatch.setattr("minigpt.data.soft_targets.counted_without", lambda text, edges, fold: text)
    build_soft_targets(root / ENCODED_DIR, root / SOFT_TARGETS_DIR, 3, 16, 5, 0.9)
    monkeypatch.undo()
    report = run_preflight(params, root)
    assert [c["name"] for c in report["checks"] if c["status"] == "failed"] == ["soft_targets_held_out"]
    held_out = next(c for c in report["checks"] if c["name"] == "soft_targets_held_out")["measured"]
    assert held_out["stored_mass_on_next_token"] > held_out["held_out_mass_on_next_token"]


def test_targets_looked_up_at_the_inputs_positions_fail_soft_targets_aligned(project, monkeypatch):
    root, source = project
    params = recompose(root, source, DISTILL)
    run_stage(root, "soft_targets")

    def at_the_inputs(self, starts, block_size, device="cpu"):  # the planted bug: starts + t, not starts + t + 1
        return self.at(starts[:, None] + torch.arange(block_size), device)

    monkeypatch.setattr(SoftTargets, "for_targets", at_the_inputs)
    report = run_preflight(params, root)
    assert [c["name"] for c in report["checks"] if c["status"] == "failed"] == ["soft_targets_aligned"]


def test_targets_of_other_settings_fail_soft_targets_and_the_gate_binds_them(project):
    root, source = project
    params = recompose(root, source, DISTILL)
    run_stage(root, "soft_targets")
    other = recompose(root, source, ["soft_targets.order=4", "train.distill_alpha=0.3"])
    report = run_preflight(other, root)
    assert "soft_targets" in report["failed"] and "order = 4 but the targets were built with 3" in json.dumps(report)
    assert run_preflight(params, root)["passed"]
    verify_gate(params, root)
    arrays = root / SOFT_TARGETS_DIR / soft_target_files.ARRAYS_NAME
    arrays.write_bytes(arrays.read_bytes() + b"\0")  # the targets changed after preflight proved them
    with pytest.raises(GateError, match="mismatched fingerprint: soft targets"):
        verify_gate(params, root)
