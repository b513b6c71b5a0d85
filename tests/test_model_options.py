"""The model and optimizer options beyond the guide's MiniGPT (model.position / qk_norm / mlp / attention_dropout /
attention_precision / ngram_orders, train.optimizer): each
builds what it says, trains through the gated pipeline, passes preflight, and a bug planted
in it is caught by the check that owns it."""

import copy
import io
import math

import pytest
import torch

from helpers.pipeline_fixture import recompose
from helpers.tiny_models import small_config
from minigpt.core.config import ConfigError
from minigpt.model import gpt as model_module
from minigpt.model import ngram_embedding, rotary
from minigpt.model.gpt import MiniGPT, MiniGPTConfig, mlp_hidden_width
from minigpt.preflight.architecture_checks import expected_parameters, measured_parameters
from minigpt.preflight.checks import format_table
from minigpt.preflight.suite import run_preflight
from minigpt.testing.planted_bugs import (
    fp32_attention_without_the_mask,
    muon_gets_the_embedding,
    ngram_lookup_never_added,
    ngram_rows_one_token_late,
    qk_norm_over_positions,
    rotate_half_over_time,
)
from minigpt.train import optim
from minigpt.train.loop import train

ALL_OPTIONS = ["model.position=rotary", "model.qk_norm=true", "model.mlp=swiglu", "train.optimizer=muon"]
NGRAMS = ["model.ngram_orders=4", "model.ngram_buckets=256"]
FAST = ["train.max_steps=30", "train.eval_every=15", "train.eval_batches=2", "train.sample_length=10"]


def failed(report):
    return [c["name"] for c in report["checks"] if c["status"] == "failed"]


def check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


@pytest.mark.parametrize("options", [["model.position=rotary"], ["model.qk_norm=true"], ["model.mlp=relu2"],
                                     ["model.mlp=swiglu"], ["train.optimizer=muon"],
                                     ["model.dropout=0.1", "model.attention_dropout=false"], NGRAMS, ALL_OPTIONS,
                                     [*ALL_OPTIONS, "train.precision=bf16"],
                                     [*ALL_OPTIONS, "model.attention_precision=fp32", "train.precision=bf16"]],
                         ids=lambda o: "+".join(x.split("=")[0].split(".")[1] + "=" + x.split("=")[1] for x in o))
def test_each_option_passes_preflight_and_trains_through_the_gate(project, options):
    root, source = project
    params = recompose(root, source, [*FAST, *options])
    report = run_preflight(params, root)
    assert report["passed"], format_table(report["checks"])
    summary = train(params, root, out=lambda _m: None)
    assert summary["steps"] == 30
    assert summary["best_val_loss"] < math.log(report["vocab_size"]) - 0.3, "it learned something in 30 steps"
    built = check(report, "architecture")["measured"]
    assert {k: built["parameters"].get(k, 0) for k in built["expected_parameters"]} == built["expected_parameters"]
    if "train.optimizer=muon" in options:
        muon = check(report, "decay_split")["measured"]["muon"]
        assert "blocks.0.attn.qkv.weight" in muon and "tok_emb.weight" not in muon and "head.weight" not in muon


def test_rotate_half_over_the_positions_leaks_the_future_and_fails_the_causal_check(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(rotary, "apply_rotary", rotate_half_over_time)
    report = run_preflight(recompose(root, source, ["model.position=rotary"]), root)
    assert "causal_independence" in failed(report)
    assert "depend on later tokens" in check(report, "causal_independence")["message"]


def test_the_planted_rotary_bug_is_invisible_to_the_learned_position_model(project, monkeypatch):
    """The causal check fails because of rotary, not because patching broke something else."""
    root, source = project
    monkeypatch.setattr(rotary, "apply_rotary", rotate_half_over_time)
    assert run_preflight(recompose(root, source, []), root)["passed"]


@pytest.mark.parametrize("attention_precision,seen", [("step", torch.bfloat16), ("fp32", torch.float32)])
def test_attention_precision_fp32_runs_a_bf16_steps_attention_in_fp32(monkeypatch, attention_precision, seen):
    """Under bf16 autocast q, k and v reach the attention in bf16, or in fp32 with attention_precision=fp32 (its
    output handed back in bf16); in an fp32 step both are fp32 and the outputs are the same tensor values."""
    dtypes = []
    real = model_module.causal_attention
    monkeypatch.setattr(model_module, "causal_attention", lambda q, k, v, p: dtypes.append(q.dtype) or real(q, k, v, p))
    torch.manual_seed(0)
    model = MiniGPT(small_config(vocab=23, position="rotary", qk_norm=True, attention_precision=attention_precision))
    inputs = torch.randint(0, 23, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(inputs)
    assert dtypes == [seen] * 2 and logits.dtype == torch.bfloat16
    reference = MiniGPT(small_config(vocab=23, position="rotary", qk_norm=True))
    reference.load_state_dict(model.state_dict())
    assert torch.equal(model(inputs)[0], reference(inputs)[0]), "no effect in an fp32 step"


def test_fp32_attention_that_forgets_the_mask_fails_the_causal_check(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(model_module, "in_fp32", fp32_attention_without_the_mask)
    report = run_preflight(recompose(root, source, ["model.attention_precision=fp32"]), root)
    assert "causal_independence" in failed(report)
    # the same plant in a model whose attention runs in the step's precision: it never reaches the check
    assert run_preflight(recompose(root, source, []), root)["passed"]


def test_qk_norm_over_the_positions_leaks_the_future_and_fails_the_causal_check(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(model_module, "normalise_heads", qk_norm_over_positions)
    report = run_preflight(recompose(root, source, ["model.qk_norm=true"]), root)
    assert "causal_independence" in failed(report)


def test_muon_handed_the_embedding_and_head_fails_decay_split(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(optim, "muon_parameters", muon_gets_the_embedding)
    report = run_preflight(recompose(root, source, ["train.optimizer=muon"]), root)
    assert failed(report)[0] == "decay_split", "the first check to fail names the split"
    message = check(report, "decay_split")["message"]
    assert "trained by Muon but not a hidden matrix" in message and "tok_emb.weight" in message
    assert "head.weight" in message


class PositionTableUnderRotary(MiniGPT):
    def __init__(self, config):
        super().__init__(config)
        self.pos_emb = torch.nn.Embedding(config.block_size, config.embedding_dim)

    def forward(self, inputs, targets=None, cache=None):  # a table that is even used
        logits, loss = super().forward(inputs, targets, cache)
        return logits + 0 * self.pos_emb.weight.sum(), loss


class GeluUnderRelu2(MiniGPT):
    def __init__(self, config):
        super().__init__(config)
        for block in self.blocks:
            block.mlp.act = torch.nn.GELU()


@pytest.mark.parametrize("factory,options,says", [
    (PositionTableUnderRotary, ["model.position=rotary"], "pos_emb: "),
    (GeluUnderRelu2, ["model.mlp=relu2"], "is not model.mlp = 'relu2'"),
], ids=["position-table-under-rotary", "gelu-under-relu2"])
def test_a_model_that_is_not_the_configured_one_fails_architecture(project, factory, options, says):
    root, source = project
    report = run_preflight(recompose(root, source, options), root, model_factory=factory)
    assert "architecture" in failed(report)
    assert says in check(report, "architecture")["message"]


def test_a_gated_mlp_of_the_full_width_fails_architecture(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(model_module, "mlp_hidden_width", lambda c: c.expansion_factor * c.embedding_dim)
    report = run_preflight(recompose(root, source, ["model.mlp=swiglu"]), root)
    assert "architecture" in failed(report)
    assert "blocks: " in check(report, "architecture")["message"]


@pytest.mark.parametrize("options", [{}, {"position": "rotary", "qk_norm": True, "mlp": "swiglu"}, {"mlp": "relu2"},
                                     {"ngram_orders": 3, "ngram_buckets": 50}])
def test_the_closed_form_parameter_count_is_the_built_models(options):
    config = small_config(vocab=37, **options)
    model = MiniGPT(config)
    measured, expected = measured_parameters(model), expected_parameters(config)
    assert {k: measured.get(k, 0) for k in expected} == expected and set(measured) <= set(expected)
    assert sum(expected_parameters(config).values()) == model.num_parameters()


def test_the_gated_mlp_keeps_about_the_parameters_of_the_plain_one():
    plain, gated = small_config(embedding_dim=96), small_config(embedding_dim=96, mlp="swiglu")
    assert mlp_hidden_width(gated) % 32 == 0
    ratio = 3 * mlp_hidden_width(gated) / (2 * mlp_hidden_width(plain))
    assert 1.0 <= ratio < 1.15


def test_rotary_attention_scores_depend_on_the_position_difference_only():
    cos, sin = rotary.rotary_tables(32, 8)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        qi = rotary.apply_rotary(q.view(1, 1, 1, 8), cos[i:i + 1], sin[i:i + 1])
        kj = rotary.apply_rotary(k.view(1, 1, 1, 8), cos[j:j + 1], sin[j:j + 1])
        return float((qi * kj).sum())

    assert score(5, 2) == pytest.approx(score(25, 22), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)
    rotated = rotary.apply_rotary(q.view(1, 1, 1, 8), cos[7:8], sin[7:8])
    assert float(rotated.norm()) == pytest.approx(float(q.norm()), rel=1e-5), "a rotation keeps the norm"


@pytest.mark.parametrize("options", [{"position": "rotary"}, {"position": "rotary", "qk_norm": True, "mlp": "swiglu"},
                                     {"ngram_orders": 4, "ngram_buckets": 64},
                                     {"position": "rotary", "ngram_orders": 3, "ngram_buckets": 64}])
def test_kv_cached_decoding_matches_the_full_forward_pass(options):
    torch.manual_seed(0)
    model = MiniGPT(small_config(**options)).eval()
    ids = torch.randint(0, 40, (2, 12))
    full, _ = model(ids)
    cache, logits = model._prefill(ids[:, :5])
    steps = [logits[:, -1]]
    for t in range(5, 12):
        logits, _ = model(ids[:, t:t + 1], cache=cache)
        steps.append(logits[:, -1])
    assert torch.allclose(torch.stack(steps[:-1], 1), full[:, 4:11], atol=1e-5)


def test_rotary_needs_an_even_head_width(project):
    root, source = project
    with pytest.raises(ConfigError, match="'model.position' = 'rotary' needs an even head width"):
        recompose(root, source, ["model.position=rotary", "model.embedding_dim=60", "model.num_heads=4"])


def test_a_checkpoint_config_from_before_the_options_builds_the_guides_model():
    old = dict(vocab_size=40, block_size=16, embedding_dim=32, num_heads=4, num_layers=2, expansion_factor=4,
               dropout=0.0)
    config = MiniGPTConfig(**old)
    assert (config.position, config.qk_norm, config.mlp) == ("learned", False, "gelu")
    assert set(MiniGPT(config).state_dict()) == set(MiniGPT(small_config()).state_dict())


def test_muon_with_adamw_state_round_trips_through_a_weights_only_load():
    """Resuming a Muon run: the combined state saves and loads (weights_only) and the next step is identical."""
    torch.manual_seed(0)
    a = MiniGPT(small_config())
    b = copy.deepcopy(a)
    ids = torch.randint(0, 40, (4, 17))
    opt_a = optim.make_optimizer(a, "muon", 3e-3, 0.1)
    for _ in range(3):
        opt_a.zero_grad()
        a(ids[:, :-1], ids[:, 1:])[1].backward()
        opt_a.step()
    buffer = io.BytesIO()
    torch.save({"model": a.state_dict(), "optimizer": opt_a.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    b.load_state_dict(saved["model"])
    opt_b = optim.make_optimizer(b, "muon", 3e-3, 0.1)
    opt_b.load_state_dict(saved["optimizer"])
    for model, opt in ((a, opt_a), (b, opt_b)):
        opt.zero_grad()
        model(ids[:, :-1], ids[:, 1:])[1].backward()
        opt.step()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(ValueError, match="not a Muon \\+ AdamW optimizer state"):
        opt_b.load_state_dict(optim.make_adamw(b, 3e-3, 0.1).state_dict())


def test_muon_trains_the_hidden_matrices_and_adamw_the_rest():
    model = MiniGPT(small_config(position="rotary"))
    opt = optim.make_optimizer(model, "muon", 1e-3, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in opt.param_groups if optim.is_muon_group(g) for p in g["params"]}
    in_adamw = {names[id(p)] for g in opt.param_groups if not optim.is_muon_group(g) for p in g["params"]}
    assert in_muon == set(model.hidden_matrices())
    assert in_adamw == set(names.values()) - in_muon
    assert {"tok_emb.weight", "ln_f.weight"} <= in_adamw
    assert not optim.is_muon_group(opt.param_groups[0]), "AdamW's groups first: the step reports group 0's LR"


def test_an_ngram_hash_one_token_late_sees_the_target_and_fails_the_causal_check(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(ngram_embedding, "ngram_rows", ngram_rows_one_token_late)
    report = run_preflight(recompose(root, source, NGRAMS), root)
    assert "causal_independence" in failed(report)
    assert "depend on later tokens" in check(report, "causal_independence")["message"]
    assert run_preflight(recompose(root, source, []), root)["passed"], "the plant acts through the option only"


def test_an_ngram_table_whose_lookup_is_never_added_fails_gradients(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(ngram_embedding.HashedNgramEmbedding, "forward", ngram_lookup_never_added)
    report = run_preflight(recompose(root, source, NGRAMS), root)
    assert "gradients" in failed(report)
    assert "no gradient for ngram_emb.table.weight" in check(report, "gradients")["message"]


def test_each_ngram_row_reads_its_own_n_tokens_only():
    """Order n's row at position t is a function of tokens t - n + 1 .. t: changing the token just before them, or
    any later one, leaves it as it is; changing one of them moves it."""
    # fixed IDs: for arbitrary ones a changed n-gram can land in its old bucket (1 in 1,000) and fail the test by chance
    ids = torch.randint(0, 30, (1, 12), generator=torch.Generator().manual_seed(0))
    rows = ngram_embedding.ngram_rows(ids, 4, 1000, 30)  # [3 orders, B, T]
    t = 8
    for order in (2, 3, 4):
        before, inside = ids.clone(), ids.clone()
        before[0, t - order] = (before[0, t - order] + 1) % 30
        before[0, t + 1:] = (before[0, t + 1:] + 1) % 30
        inside[0, t - order + 1] = (inside[0, t - order + 1] + 1) % 30
        assert ngram_embedding.ngram_rows(before, 4, 1000, 30)[order - 2, 0, t] == rows[order - 2, 0, t]
        assert ngram_embedding.ngram_rows(inside, 4, 1000, 30)[order - 2, 0, t] != rows[order - 2, 0, t]
    assert bool(((rows >= 0) & (rows < 3000)).all())
    for order in (2, 3, 4):  # each order indexes its own rows of the table
        assert bool(((rows[order - 2] >= (order - 2) * 1000) & (rows[order - 2] < (order - 1) * 1000)).all())


def test_the_ngram_hash_spreads_distinct_ngrams_over_the_buckets():
    vocab, buckets = 40, 4096
    first, second = torch.meshgrid(torch.arange(vocab), torch.arange(vocab), indexing="ij")
    bigrams = torch.stack([first.flatten(), second.flatten()], dim=1)  # every (previous, current) pair
    rows = ngram_embedding.ngram_rows(bigrams, 2, buckets, vocab)[0, :, 1]
    # 1,600 bigrams into 4,096 buckets: a uniform hash leaves ~1,325 distinct rows; a degenerate one far fewer
    assert len(torch.unique(rows)) > 1250


def test_ngram_orders_1_is_refused_with_the_key_named(project):
    root, source = project
    with pytest.raises(ConfigError, match="'model.ngram_orders' = 1"):
        recompose(root, source, ["model.ngram_orders=1"])
