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


def save_as_trained(root, model, tokenizer_fingerprint, **extra):
    """The best checkpoint of a model trained by hand, with the train stage's provenance record a run would leave
    (it read the encoded splits and the tokenizer, it wrote this checkpoint), so evaluate and generate accept it."""
    from minigpt.core.paths import BEST_CHECKPOINT
    from minigpt.core.provenance import Custody
    from minigpt.model.checkpoint import save_checkpoint

    save_checkpoint(root / BEST_CHECKPOINT, model, tokenizer_fingerprint, **extra)
    custody = Custody("train", root)
    for role in ("tokenizer", "train ids", "val ids"):
        custody.take(role)
    custody.made(BEST_CHECKPOINT)
    custody.write()
