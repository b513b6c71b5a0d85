"""Mini-GPT: a pre-LayerNorm decoder-only transformer over characters.

token + position embeddings -> num_layers x [LN -> causal self-attention -> +residual, LN -> MLP -> +residual]
-> final LN -> vocabulary head. Causality is not configurable: attention always uses is_causal=True.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field

from minigpt.config import ModelConfig
from minigpt.sampling import SamplingSettings, next_token_logits

INIT_STD = 0.02


class MiniGPTConfig(ModelConfig):
    """params.yaml's `model` section (its fields and rules, declared once in config.py) + the vocabulary size.

    A pydantic model: build it with keywords, e.g. MiniGPTConfig(**checkpoint["config"]).
    """

    vocab_size: int = Field(ge=1, description=">= 1")

    @classmethod
    def from_params(cls, model_params: ModelConfig, vocab_size: int) -> "MiniGPTConfig":
        """The model config from params.yaml's `model` section and the tokenizer's vocabulary size."""
        return cls(vocab_size=vocab_size, **model_params.model_dump())


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Scaled dot-product attention where position t sees positions <= t only."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.embedding_dim, 3 * config.embedding_dim)
        self.proj = nn.Linear(config.embedding_dim, config.embedding_dim)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # [B, T, C] -> [B, heads, T, head_dim]
        q, k, v = (t.view(batch, time, self.num_heads, width // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, time, width)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        hidden = config.expansion_factor * config.embedding_dim
        self.fc = nn.Linear(config.embedding_dim, hidden)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, config.embedding_dim)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.embedding_dim)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.embedding_dim)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.pos_emb = nn.Embedding(config.block_size, config.embedding_dim)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.embedding_dim)
        self.head = nn.Linear(config.embedding_dim, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # residual projections scaled down so the residual stream's variance does not grow with depth
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=INIT_STD / math.sqrt(2 * config.num_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # small weights: a new model's logits are near zero, so its loss starts near log(vocab_size)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None):
        """inputs [B, T] long -> (logits [B, T, V], mean cross-entropy over B*T or None)."""
        batch, time = inputs.shape
        if time > self.config.block_size:
            raise ValueError(f"sequence length {time} exceeds block_size {self.config.block_size}")
        positions = torch.arange(time, device=inputs.device)
        x = self.drop(self.tok_emb(inputs) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(batch * time, -1).float(), targets.reshape(batch * time))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
    ) -> torch.Tensor:
        """Append max_new_tokens sampled IDs to inputs [B, T]; context cropped to block_size, eval mode."""
        settings = SamplingSettings(temperature, top_k, top_p, repetition_penalty)
        settings.validate(self.config.vocab_size, "sampling")
        was_training = self.training
        self.eval()
        try:
            out = inputs
            for _ in range(max_new_tokens):
                context = out[:, -self.config.block_size:]
                logits, _ = self(context)
                # only the last position predicts the next token
                logits = next_token_logits(logits[:, -1, :], context, settings)
                next_id = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
                out = torch.cat([out, next_id], dim=1)
            return out
        finally:
            self.train(was_training)
