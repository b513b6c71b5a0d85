import math

import pytest
import torch

from minigpt.core.config import ModelConfig
from minigpt.data.batching import get_batch
from minigpt.model.gpt import KVCache, MiniGPT, MiniGPTConfig


def config(**overrides):
    base = dict(vocab_size=50, block_size=16, embedding_dim=32, num_heads=4, num_layers=2, expansion_factor=4,
                dropout=0.0)
    return MiniGPTConfig(**{**base, **overrides})


def test_forward_returns_logits_and_mean_cross_entropy():
    torch.manual_seed(0)
    model = MiniGPT(config())
    inputs = torch.randint(0, 50, (3, 10))
    targets = torch.randint(0, 50, (3, 10))
    logits, loss = model(inputs, targets)
    assert logits.shape == (3, 10, 50) and loss.dim() == 0
    expected = torch.nn.functional.cross_entropy(logits.reshape(30, 50), targets.reshape(30))
    assert torch.allclose(loss, expected)
    assert model(inputs)[1] is None


def test_fresh_model_loss_is_close_to_log_vocab():
    for vocab in (50, 120, 300):
        torch.manual_seed(1)
        model = MiniGPT(config(vocab_size=vocab, embedding_dim=64))
        _, loss = model(torch.randint(0, vocab, (8, 16)), torch.randint(0, vocab, (8, 16)))
        assert abs(loss.item() - math.log(vocab)) < 0.1


def test_sequence_longer_than_block_is_rejected():
    with pytest.raises(ValueError, match="exceeds block_size 16"):
        MiniGPT(config())(torch.zeros(1, 17, dtype=torch.long))


def test_config_from_params_takes_vocab_from_tokenizer():
    cfg = MiniGPTConfig.from_params(ModelConfig(block_size=32, embedding_dim=64, num_heads=4, num_layers=2,
                                                  expansion_factor=4, dropout=0.0), vocab_size=99)
    assert cfg.vocab_size == 99 and cfg.block_size == 32
    with pytest.raises(ValueError, match="not divisible"):
        config(embedding_dim=30)


def test_generate_costs_one_position_per_token_and_restarts_a_full_window_from_its_half(monkeypatch):
    torch.manual_seed(0)
    model = MiniGPT(config())  # block_size 16
    model.train()
    seen = []
    real_forward = MiniGPT.forward

    def spy(self, inputs, targets=None, cache=None):
        seen.append((inputs.shape[1], cache.length if cache else None, self.training))
        return real_forward(self, inputs, targets, cache)

    monkeypatch.setattr(MiniGPT, "forward", spy)
    out = model.generate(torch.zeros(2, 14, dtype=torch.long), max_new_tokens=6,
                         generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 20)
    # the prompt (14) fills the cache, one position per token until 16, then the last 8 tokens, then one at a time
    assert [(t, start) for t, start, _ in seen] == [(14, 0), (1, 14), (1, 15), (8, 0), (1, 8), (1, 9)]
    assert not any(training for _, _, training in seen) and model.training


def test_cached_logits_equal_a_full_forward_pass_of_the_same_positions():
    torch.manual_seed(0)
    model = MiniGPT(config()).eval()
    ids = torch.randint(0, 50, (2, 12))
    full, _ = model(ids)
    cache = KVCache(len(model.blocks))
    prefix, _ = model(ids[:, :5], cache=cache)
    steps = [model(ids[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
    assert torch.allclose(torch.cat([prefix, *steps], dim=1), full, atol=1e-5)
    with pytest.raises(ValueError, match="exceeds block_size 16"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_within_the_window_cached_sampling_picks_what_recomputing_would():
    """Greedy decoding of a text shorter than the window: the cache changes the cost, not the tokens."""
    torch.manual_seed(0)
    model = MiniGPT(config()).eval()
    prompt = torch.randint(0, 50, (1, 4))
    cached = model.generate(prompt, 10, top_k=1)
    recomputed = prompt
    for _ in range(10):
        logits, _ = model(recomputed)
        recomputed = torch.cat([recomputed, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, recomputed)


def test_generate_is_reproducible_with_a_seeded_generator_and_top_k_one_is_greedy():
    torch.manual_seed(0)
    model = MiniGPT(config())
    prompt = torch.zeros(1, 3, dtype=torch.long)
    a = model.generate(prompt, 8, generator=torch.Generator().manual_seed(5))
    b = model.generate(prompt, 8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    greedy = model.generate(prompt, 4, top_k=1)
    logits, _ = model(prompt)
    assert int(greedy[0, 3]) == int(logits[0, -1].argmax())


def test_attention_is_causal_by_construction():
    torch.manual_seed(0)
    model = MiniGPT(config()).eval()
    x = torch.randint(0, 50, (1, 12))
    y = x.clone()
    y[0, 6:] = (y[0, 6:] + 7) % 50
    with torch.no_grad():
        assert torch.allclose(model(x)[0][:, :6], model(y)[0][:, :6], atol=1e-6)


def test_get_batch_windows_are_shifted_by_one():
    data = torch.arange(100)
    inputs, targets = get_batch(data, 4, 8, "cpu", torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (4, 8) and inputs.dtype == targets.dtype == torch.long
    assert torch.equal(targets, inputs + 1)  # consecutive data: the next token is always +1
    assert int(inputs.max()) <= 98
    with pytest.raises(ValueError, match="needs block_size \\+ 1 = 9"):
        get_batch(torch.arange(8), 1, 8)
