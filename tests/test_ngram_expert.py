"""model.ngram_expert: the output mixed with the soft targets' n-gram by a learned gate. The mixture is a
distribution and starts even; training, the in-run evaluations, evaluate and generate all mix the n-gram in, each
with the one of its positions; a checkpoint refuses another n-gram; preflight's two checks catch priors one
position off, priors counted with the split they score, and a gate that does not start at zero."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.pipeline_fixture import recompose, record_as_written, run_stage
from helpers.tiny_models import small_config
from minigpt.core.errors import ConfigError, DataError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.data import soft_target_files
from minigpt.data.encode import load_ids
from minigpt.data.soft_target_files import (
    NextTokenNgram,
    Priors,
    build_soft_targets,
    load_heldout_priors,
    load_soft_targets,
)
from minigpt.data.soft_targets import count_ngrams, heldout_topk
from minigpt.evaluate.checkpoint_eval import evaluate_checkpoint
from minigpt.evaluate.doctor import diagnose
from minigpt.evaluate.generation import generate_samples
from minigpt.evaluate.scoring import target_nll
from minigpt.model import batch_loss
from minigpt.model.checkpoint import load_trained_model
from minigpt.model.gpt import MiniGPT
from minigpt.model.ngram_expert import mixed_log_probs, prior_log_probs
from minigpt.model.sampling import SamplingSettings
from minigpt.preflight.suite import run_preflight
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train

EXPERT = ["soft_targets.order=3", "model.ngram_expert=true"]
FAST = ["train.max_steps=30", "train.eval_every=10", "train.eval_batches=2", "train.sample_length=0"]


def random_prior(shape, vocab, top, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:top] for _ in range(int(np.prod(shape)))])
    probs = torch.rand(*shape, top, generator=gen)
    return ids.view(*shape, top), probs / probs.sum(-1, keepdim=True), torch.rand(*shape, generator=gen) * 0.2


def test_the_prior_and_the_mixture_are_distributions_of_the_stated_form():
    vocab, top = 12, 4
    prior = random_prior((3, 5), vocab, top)
    q = prior_log_probs(prior, vocab).exp()
    assert torch.allclose(q.sum(-1), torch.ones(3, 5), atol=1e-6)
    ids, probs, rest = prior
    kept = q.gather(-1, ids)
    assert torch.allclose(kept, probs * (1 - rest)[..., None], atol=1e-6)  # the kept tokens at their share
    others = q.sum(-1) - kept.sum(-1)
    assert torch.allclose(others, rest, atol=1e-6)  # the rest spread over the other tokens
    logits, gate = torch.randn(3, 5, vocab), torch.randn(3, 5, 1)
    w = torch.sigmoid(gate)
    expected = w * F.softmax(logits, -1) + (1 - w) * q
    assert torch.allclose(mixed_log_probs(logits, gate, prior).exp(), expected, atol=1e-6)


def test_the_model_mixes_only_when_given_the_prior_and_starts_even():
    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=12, block_size=8, ngram_expert=True))
    inputs, targets = torch.randint(0, 12, (2, 8)), torch.randint(0, 12, (2, 8))
    prior = random_prior((2, 8), 12, 4)
    network, network_loss = model(inputs, targets)
    mixed, loss = model(inputs, targets, prior=prior)
    even = 0.5 * F.softmax(network, -1) + 0.5 * prior_log_probs(prior, 12).exp()
    assert torch.allclose(mixed.exp(), even, atol=1e-6)
    assert float(loss) == pytest.approx(float(F.nll_loss(even.log().view(-1, 12), targets.view(-1))), rel=1e-5)
    assert abs(float(loss) - float(network_loss)) > 1e-3
    loss.backward()  # the gate learns
    assert model.expert_gate.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="without model.ngram_expert"):
        MiniGPT(small_config(vocab=12, block_size=8))(inputs, prior=prior)


def test_generation_mixes_the_ngram_of_the_text_so_far():
    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=12, block_size=8, ngram_expert=True))
    seen = []

    def certain_ngram(ids):  # an n-gram sure of token 3 next (all its mass on it), whatever the text
        seen.append(ids.shape[1])
        return torch.full((1, 1, 1), 3), torch.ones(1, 1, 1), torch.zeros(1, 1)

    out = model.generate(torch.zeros(1, 2, dtype=torch.long), 12, top_k=1, prior_of=certain_ngram)
    # top_k 1 samples the likeliest: half of the mass or more is on 3 at every step
    assert out[0, 2:].tolist() == [3] * 12 and seen == list(range(2, 14))
    with pytest.raises(ValueError, match="needs the n-gram"):
        next(model.generate_stream(torch.zeros(1, 2, dtype=torch.long), 1, SamplingSettings()))


def test_the_next_token_ngram_is_the_stored_ngram_of_the_text_so_far(fixture_texts):
    text = fixture_texts["wiki.train.raw"][:20_000]
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text])
    summary = {"order": 4, "top": 8, "discount": 0.9, "vocab_size": len(chars)}
    ngram = NextTokenNgram(ids[:15_000], summary)
    counts = count_ngrams(ids[:15_000], len(chars), 4)
    for t in (1, 2, 500, 19_999):
        top_ids, probs, _, kept = heldout_topk(counts, ids, np.array([t]), 8, 0.9)
        got_ids, got_probs, got_rest = ngram(torch.from_numpy(ids[:t])[None])
        assert got_ids.shape == (1, 1, 8) and got_rest.shape == (1, 1)
        assert torch.equal(got_ids[0, 0], torch.from_numpy(top_ids[0]))
        assert np.allclose(got_probs[0, 0].numpy(), probs[0]) and float(got_rest) == pytest.approx(1 - kept[0])


def test_dynamic_evaluation_mixes_the_ngram_in_and_at_a_vanishing_lr_is_the_static_score():
    from minigpt.evaluate.dynamic import dynamic_score

    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=12, block_size=8, ngram_expert=True)).eval()
    ids = torch.randint(0, 12, (300,)).numpy()
    ids_t, probs, rest = random_prior((300,), 12, 4)
    priors = Priors(ids_t, probs.half(), rest)
    static = target_nll(model, ids, 4, 4, torch.device("cpu"), priors=priors)
    dynamic = dynamic_score(model, ids, 4, 1, 1e-12, torch.device("cpu"), priors=priors)
    assert dynamic["loss"] == pytest.approx(float(static.mean()), rel=1e-5)
    with pytest.raises(ValueError, match="needs the split's n-gram priors"):
        dynamic_score(model, ids, 4, 1, 1e-12, torch.device("cpu"))


def test_the_expert_needs_soft_targets(project):
    root, source = project
    with pytest.raises(ConfigError, match="'model.ngram_expert' = true mixes the output with the soft targets"):
        recompose(root, source, ["model.ngram_expert=true"])


def test_the_stage_stores_val_and_test_priors_counted_on_train(project):
    root, source = project
    recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    priors = load_heldout_priors(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)
    summary = json.loads((root / SOFT_TARGETS_DIR / "summary.json").read_text())
    train = np.asarray(load_ids(root / ENCODED_DIR, "train"), dtype=np.int64)
    counts = count_ngrams(train, summary["vocab_size"], 3)
    for split in ("val", "test"):
        ids = np.asarray(load_ids(root / ENCODED_DIR, split), dtype=np.int64)
        prior = priors[split].at(torch.arange(1, len(ids)))
        q = prior_log_probs(prior, summary["vocab_size"])
        bits = -q.gather(-1, torch.from_numpy(ids[1:])[:, None]).double() / np.log(2)
        _, _, expected_bits, kept = heldout_topk(counts, ids, np.arange(1, len(ids)), 16, 0.9)
        assert np.allclose(priors[split].rest[1:].numpy(), 1 - kept, atol=1e-6)
        # the stored top 16 + spread rest scores the targets about as the full n-gram does, and the summary says so
        assert float(bits.mean()) == pytest.approx(float(expected_bits.mean()), abs=0.05)
        assert summary["heldout_bits_per_token"][split] == pytest.approx(float(expected_bits.mean()), rel=1e-9)
    soft = load_soft_targets(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)
    assert soft.rest.shape == (len(train),) and float(soft.rest[0]) == 0  # position 0: one-hot on its own token


def test_an_expert_run_trains_evaluates_and_generates_with_the_ngram(project):
    root, source = project
    params = recompose(root, source, EXPERT + FAST + ["generate.max_new_tokens=20"])
    run_stage(root, "soft_targets")
    report = run_preflight(params, root)
    assert report["passed"], report["failed"]
    checks = {c["name"]: c["measured"] for c in report["checks"]}
    assert checks["ngram_priors"]["val"]["max_abs_difference"] < 1e-3
    assert checks["expert_gate_even"]["max_abs_difference"] < 1e-6
    summary = train(params, root, out=lambda _m: None)
    assert summary["steps"] == 30
    checkpoint = torch.load(root / "models/mini_gpt_best.pt", weights_only=True)
    assert checkpoint["ngram_expert_source"]["order"] == 3
    best = load_trained_model(root / "models/mini_gpt_best.pt", root / "data/tokenizer/tokenizer.json", "cpu").model
    val_ids = torch.from_numpy(np.asarray(load_ids(root / ENCODED_DIR, "val"), dtype=np.int64))
    val_priors = load_heldout_priors(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)["val"]
    cfg = params.train
    loop_batches = batch_loss.fixed_val_batches(val_ids, cfg.eval_batches, cfg.batch_size, params.model.block_size,
                                                cfg.seed, torch.device("cpu"), val_priors)
    logged = checkpoint["best_val_loss"]
    assert batch_loss.evaluate_model(best, loop_batches, cfg.precision) == pytest.approx(logged, rel=1e-5)
    alone = [(x, y) for x, y, _prior in loop_batches]
    assert abs(batch_loss.evaluate_model(_network_alone(best), alone, cfg.precision) - logged) > 1e-2
    assert float(checkpoint["model_state_dict"]["expert_gate.bias"].abs()) > 0  # the gate trained
    # evaluate's val figure is the mixture's, position by position
    metrics = evaluate_checkpoint(params, root)
    assert metrics["ngram_expert"]["order"] == 3
    model = load_trained_model(root / "models/mini_gpt_best.pt", root / "data/tokenizer/tokenizer.json", "cpu").model
    val = np.asarray(load_ids(root / ENCODED_DIR, "val"), dtype=np.int64)
    priors = load_heldout_priors(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)["val"]
    block = model.config.block_size
    mixed = target_nll(model, val, block // 2, 8, torch.device("cpu"), priors=priors)
    assert metrics["val"]["loss"] == pytest.approx(float(mixed.mean()), rel=1e-6)
    first = torch.from_numpy(val[:block + 1])[None]
    # the prior of target t (val[t], t = 1 .. block) looked up by hand, not through Priors.for_targets
    logits, _ = model(first[:, :-1], prior=priors.at(torch.arange(1, block + 1)[None]))
    by_hand = F.cross_entropy(logits[0], first[0, 1:], reduction="none").detach()
    assert np.allclose(mixed[:block], by_hand.double().numpy(), atol=1e-5)
    network = target_nll(_network_alone(model), val, block // 2, 8, torch.device("cpu"))
    assert abs(float(network.mean()) - float(mixed.mean())) > 1e-3
    generation, _ = generate_samples(params, root)
    assert all(len(s["text"]) == 20 for s in generation["samples"])
    # the doctor runs the trained model with its n-gram: the gate's gradient too, and the mixture's val loss
    doctor = {r["name"]: r for r in diagnose(root / "models/mini_gpt_best.pt", root / "params.yaml", root)}
    assert all(r["status"] == "passed" for r in doctor.values()), doctor
    assert "expert_gate.bias" in doctor["gradients"]["measured"]["per_parameter_norms"]


def _network_alone(model):
    plain = MiniGPT(model.config.model_copy(update={"ngram_expert": False}))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("expert_gate")})
    return plain.eval()


def test_evaluate_refuses_soft_targets_of_other_settings(project):
    root, source = project
    params = recompose(root, source, EXPERT + FAST)
    run_stage(root, "soft_targets")
    train(params, root, require_gate=False, out=lambda _m: None)
    build_soft_targets(root / ENCODED_DIR, root / SOFT_TARGETS_DIR, 4, 16, 5, 0.9)
    with pytest.raises(DataError, match=r"another n-gram than data/soft_targets now holds \(order 3 -> 4\)"):
        evaluate_checkpoint(params, root)
    with pytest.raises(DataError, match="another n-gram"):
        generate_samples(params, root)


def test_priors_one_position_off_fail_ngram_priors(project, monkeypatch):
    root, source = project
    params = recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    real = soft_target_files.load_heldout_priors

    def shifted(folder, encoded):  # the planted bug: position t holds position t - 1's distribution
        return {split: Priors(*(torch.roll(a, 1, 0) for a in (p.ids, p.probs, p.rest)))
                for split, p in real(folder, encoded).items()}

    monkeypatch.setattr("minigpt.preflight.expert_checks.load_heldout_priors", shifted)
    report = run_preflight(params, root)
    assert report["failed"] == ["ngram_priors"]
    measured = next(c for c in report["checks"] if c["name"] == "ngram_priors")["measured"]
    assert measured["val"]["stored_mass_on_targets"] < measured["val"]["recounted_mass_on_targets"]


def test_priors_counted_with_the_split_they_score_fail_ngram_priors(project, monkeypatch):
    root, source = project
    params = recompose(root, source, EXPERT)
    splits = {s: np.asarray(load_ids(root / ENCODED_DIR, s), dtype=np.int64) for s in ("train", "val", "test")}
    leaky = np.concatenate([splits["train"], splits["val"], splits["test"]])
    real_count = soft_target_files.count_ngrams

    def counted_with_val_and_test(text, vocab, order):  # the planted bug: the held-out splits counted too
        return real_count(leaky if len(text) == len(splits["train"]) else text, vocab, order)

    monkeypatch.setattr(soft_target_files, "count_ngrams", counted_with_val_and_test)
    build_soft_targets(root / ENCODED_DIR, root / SOFT_TARGETS_DIR, 3, 16, 5, 0.9)
    monkeypatch.undo()
    report = run_preflight(params, root)
    assert report["failed"] == ["ngram_priors"]
    measured = next(c for c in report["checks"] if c["name"] == "ngram_priors")["measured"]
    assert measured["val"]["stored_mass_on_targets"] > measured["val"]["recounted_mass_on_targets"]


def test_the_mass_outside_the_kept_tokens_stored_as_the_kept_mass_fails_soft_targets_held_out(project):
    root, source = project
    params = recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    path = root / SOFT_TARGETS_DIR / soft_target_files.ARRAYS_NAME
    with np.load(path) as arrays:
        stored = dict(arrays)
    stored["rest"] = (1 - stored["rest"]).astype(np.float32)  # the planted bug: kept, not 1 - kept
    with open(path, "wb") as handle:
        np.savez(handle, **stored)
    record_as_written(root, "soft_targets", path)
    report = run_preflight(params, root)
    assert report["failed"] == ["soft_targets_held_out"]


def test_rehearsal_learns_under_the_expert_needs_the_mixture_to_fall_from_where_it_started():
    from types import SimpleNamespace

    from minigpt.preflight.checks import CheckFailed
    from minigpt.preflight.training_checks import check_rehearsal_learns

    record = {"probe_loss_before": 1.80, "probe_loss_after": 1.79, "probe_unigram_loss": 3.09, "unigram_entropy": 3.1,
              "probe_ngram_loss": 1.24, "losses": [1.8] * 60}
    ctx = SimpleNamespace(rehearsal=record, params=SimpleNamespace(preflight=SimpleNamespace(learn_margin=0.25)),
                          model_config=SimpleNamespace(vocab_size=67), summary={}, tokenizer=None)
    with pytest.raises(CheckFailed, match="below where it started"):  # far below the unigram, but stuck
        check_rehearsal_learns(ctx)
    record["probe_loss_after"] = 1.24
    assert check_rehearsal_learns(ctx)["bar"] == pytest.approx(1.55)


def test_a_gate_that_starts_away_from_zero_fails_expert_gate_even(project, monkeypatch):
    root, source = project
    params = recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    real_init = MiniGPT.__init__

    def trusting_the_network(self, config):  # the planted bug: the gate starts at sigmoid(3) = 0.95
        real_init(self, config)
        if self.expert_gate is not None:
            torch.nn.init.constant_(self.expert_gate.bias, 3.0)

    monkeypatch.setattr(MiniGPT, "__init__", trusting_the_network)
    report = run_preflight(params, root)
    assert report["failed"] == ["expert_gate_even"]


def test_the_gate_binds_the_priors(project):
    root, source = project
    params = recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    assert run_preflight(params, root)["passed"]
    verify_gate(params, root)
    priors = root / SOFT_TARGETS_DIR / soft_target_files.PRIORS_NAME
    priors.write_bytes(priors.read_bytes() + b"\0")
    with pytest.raises(GateError, match="n-gram priors of val and test"):
        verify_gate(params, root)


def test_in_run_evaluations_score_the_mixture(project):
    root, source = project
    params = recompose(root, source, EXPERT)
    run_stage(root, "soft_targets")
    torch.manual_seed(0)
    vocab = json.loads((root / ENCODED_DIR / "meta.json").read_text())["vocab_size"]
    model = MiniGPT(small_config(vocab=vocab, block_size=params.model.block_size, ngram_expert=True))
    val = torch.from_numpy(np.asarray(load_ids(root / ENCODED_DIR, "val"), dtype=np.int64))
    priors = load_heldout_priors(root / SOFT_TARGETS_DIR, root / ENCODED_DIR)["val"]
    block = params.model.block_size
    with_priors = batch_loss.fixed_val_batches(val, 2, 4, block, 0, torch.device("cpu"), priors)
    plain = batch_loss.fixed_val_batches(val, 2, 4, block, 0, torch.device("cpu"))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(with_priors, plain))  # the same windows
    shifted = Priors(*(torch.roll(a, 1, 0) for a in (priors.ids, priors.probs, priors.rest)))
    off_by_one = batch_loss.fixed_val_batches(val, 2, 4, block, 0, torch.device("cpu"), shifted)
    mixed, alone = batch_loss.evaluate_model(model, with_priors), batch_loss.evaluate_model(model, plain)
    # an untrained network: the n-gram's half carries the mixture, and only at its own positions
    assert mixed < alone - 0.1 and mixed < batch_loss.evaluate_model(model, off_by_one) - 0.3


def test_a_learning_rate_the_gate_hides_fails_lr_stability_on_the_networks_own_loss(project):
    root, source = project
    params = recompose(root, source, EXPERT + ["train.lr=1.0"])
    run_stage(root, "soft_targets")
    report = run_preflight(params, root)
    stability = next(c for c in report["checks"] if c["name"] == "lr_stability")
    measured = stability["measured"]
    # the mixture alone looks healthy (it falls to the n-gram's loss); the network's own loss is what gives it away
    assert measured["probe_loss_after"] < measured["probe_loss_before"]
    assert measured["probe_network_loss_after"] > measured["probe_network_loss_before"]
    assert stability["status"] == "failed" and "the network's own loss on fixed train batches" in stability["message"]
