"""Small models for tests that need weights: a config builder and a quickly trained debug-size model."""

import torch

from minigpt.data.batching import get_batch
from minigpt.data.encode import load_split
from minigpt.data.tokenizer import CharTokenizer
from minigpt.model.gpt import MiniGPT, MiniGPTConfig


def small_config(vocab=40, **overrides):
    base = dict(vocab_size=vocab, block_size=16, embedding_dim=32, num_heads=4, num_layers=2, expansion_factor=4,
                dropout=0.0)
    return MiniGPTConfig(**{**base, **overrides})


def train_quickly(root, steps):
    tok = CharTokenizer.load(root / "data/tokenizer/tokenizer.json")
    torch.manual_seed(0)
    model = MiniGPT(small_config(tok.vocab_size, block_size=32, embedding_dim=64))
    train = load_split(root / "data/encoded", "train")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        _, loss = model(*get_batch(train, 16, 32, "cpu", gen))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, tok
