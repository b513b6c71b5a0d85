"""Mini-GPT: a pre-LayerNorm decoder-only transformer over characters.

token + position embeddings -> num_layers x [LN -> causal self-attention -> +residual, LN -> MLP -> +residual]
-> final LN -> vocabulary head. Causality is not configurable: attention always uses is_causal=True.

The model section's options (config.ModelConfig: position, qk_norm, mlp, attention_dropout, attention_precision,
ngram_orders) change parts of it; their defaults build the guide's model. hidden_matrices() names the matrices Muon
trains (train.optimizer).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import Field

from minigpt.core.config import ModelConfig
from minigpt.model import rotary as rotary_positions
from minigpt.model.dropout import Dropout
from minigpt.model.ngram_embedding import HashedNgramEmbedding
from minigpt.model.ngram_expert import Prior, mixed_log_probs
from minigpt.model.sampling import SamplingSettings, next_token_logits

INIT_STD = 0.02

PriorOf = Callable[[torch.Tensor], Prior]  # IDs [B, T] -> the n-gram's distribution of the next token, [B, 1, ...]


class MiniGPTConfig(ModelConfig):
    """params.yaml's `model` section (its fields and rules, declared once in config.py) + the vocabulary size.

    A pydantic model: build it with keywords, e.g. MiniGPTConfig(**checkpoint["config"]).
    """

    vocab_size: int = Field(ge=1, description=">= 1")

    @classmethod
    def from_params(cls, model_params: ModelConfig, vocab_size: int) -> "MiniGPTConfig":
        """The model config from params.yaml's `model` section and the tokenizer's vocabulary size."""
        return cls(vocab_size=vocab_size, **model_params.model_dump())


class KVCache:
    """Keys and values of the positions a model has already seen, per block, for generation one token at a time.
    Positions are absolute (0 .. block_size - 1): the cache holds at most block_size of them."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0
        self.tokens: torch.Tensor | None = None  # the last IDs it was fed, for model.ngram_orders
        self.last_hidden: torch.Tensor | None = None  # the last position's final hidden state, for model.ngram_expert


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Scaled dot-product attention where position t sees positions <= t only."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


def in_fp32(attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args) -> torch.Tensor:
    """attention(q, k, v, *args) computed in fp32 when q, k, v are in a lower precision (a bf16 step), its output
    back in theirs (model.attention_precision=fp32): on the Intel Xeon with AMX it was measured on, the small shape's
    bf16 step ran faster so (docs/decisions.md, "Attention in fp32 inside bf16 steps of the small shape")."""
    if q.dtype == torch.float32:
        return attention(q, k, v, *args)
    with torch.autocast(q.device.type, enabled=False):  # autocast would cast the fp32 inputs back down
        return attention(q.float(), k.float(), v.float(), *args).to(q.dtype)


def normalise_heads(x: torch.Tensor) -> torch.Tensor:
    """QK-normalisation: each position's head vector ([B, heads, T, d]) scaled to RMS 1, over the head's width
    only (a norm over positions would mix the future into the past)."""
    return F.rms_norm(x, (x.shape[-1],))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.num_heads = config.num_heads
        # attention_dropout false: the attention weights are not dropped (dropout stays on the residual branches)
        self.dropout = config.dropout if config.attention_dropout else 0.0
        self.qk_norm = config.qk_norm
        self.attention_in_fp32 = config.attention_precision == "fp32"
        self.qkv = nn.Linear(config.embedding_dim, 3 * config.embedding_dim)
        self.proj = nn.Linear(config.embedding_dim, config.embedding_dim)
        self.resid_drop = Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """rotary: (cos, sin) of these positions under position=rotary, else None."""
        batch, time, width = x.shape
        head_dim = width // self.num_heads
        q, k, v = self.qkv(x).split(width, dim=2)
        # [B, T, C] -> [B, heads, T, head_dim]
        q, k, v = (t.view(batch, time, self.num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:
            q, k = normalise_heads(q), normalise_heads(k)
        if rotary is not None:
            q, k = rotary_positions.apply_rotary(q, *rotary), rotary_positions.apply_rotary(k, *rotary)
        if cache is not None and cache.keys[layer] is not None:
            if time != 1:
                raise ValueError("a filled KV cache takes one new position at a time")
            # one new position sees every cached one (all are in its past): no mask
            k = torch.cat([cache.keys[layer], k], dim=2)
            v = torch.cat([cache.values[layer], v], dim=2)
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            dropout_p = self.dropout if self.training else 0.0
            # causal_attention looked up at call time, so a check's planted attention reaches both paths
            y = (in_fp32(causal_attention, q, k, v, dropout_p) if self.attention_in_fp32
                 else causal_attention(q, k, v, dropout_p))
        if cache is not None:
            cache.keys[layer], cache.values[layer] = k, v
        y = y.transpose(1, 2).contiguous().view(batch, time, width)
        return self.resid_drop(self.proj(y))


def mlp_hidden_width(config: ModelConfig) -> int:
    """The MLP's hidden width: expansion_factor * embedding_dim; a gated MLP (three matrices instead of two) 2/3
    of that, rounded up to a multiple of 32, so both hold about the same parameters."""
    hidden = config.expansion_factor * config.embedding_dim
    if config.mlp == "swiglu":
        hidden = -(-(2 * hidden // 3) // 32) * 32
    return hidden


class ReLUSquared(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        hidden = mlp_hidden_width(config)
        self.gated = config.mlp == "swiglu"
        # a gated MLP's fc holds the gate and the up projection side by side (one matmul)
        self.fc = nn.Linear(config.embedding_dim, 2 * hidden if self.gated else hidden)
        self.act = {"gelu": nn.GELU, "relu2": ReLUSquared, "swiglu": nn.SiLU}[config.mlp]()
        self.proj = nn.Linear(hidden, config.embedding_dim)
        self.drop = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.fc(x).chunk(2, dim=-1)
            return self.drop(self.proj(self.act(gate) * up))
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.embedding_dim)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.embedding_dim)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, layer, rotary)
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.embedding_dim)
        self.pos_emb = nn.Embedding(config.block_size, config.embedding_dim) if config.position == "learned" else None
        if config.position == "rotary":
            cos, sin = rotary_positions.rotary_tables(config.block_size, config.embedding_dim // config.num_heads)
            # not in the state dict: a function of the config, rebuilt with the model
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.ngram_emb = (HashedNgramEmbedding(config.vocab_size, config.ngram_orders, config.ngram_buckets,
                                               config.embedding_dim) if config.ngram_orders else None)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.embedding_dim)
        self.head = nn.Linear(config.embedding_dim, config.vocab_size, bias=False)
        # model.ngram_expert: the gate between the network and the n-gram (minigpt.model.ngram_expert)
        self.expert_gate = nn.Linear(config.embedding_dim, 1) if config.ngram_expert else None
        self.apply(self._init_weights)
        if self.expert_gate is not None:  # every position starts at an even mixture
            nn.init.zeros_(self.expert_gate.weight)
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

    def hidden_matrices(self) -> list[str]:
        """Names of the blocks' linear weights: what Muon trains under train.optimizer=muon (embeddings, head,
        gains and biases stay with AdamW)."""
        return [f"blocks.{i}.{name}.weight" for i, block in enumerate(self.blocks)
                for name, module in block.named_modules() if isinstance(module, nn.Linear)]

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                prior: Prior | None = None):
        """inputs [B, T] long -> (logits [B, T, V], mean cross-entropy over B*T or None). With a cache, inputs
        continue the positions it holds (all of a prompt into an empty cache, then one position at a time).

        prior (model.ngram_expert only): the n-gram's distribution at every position [B, T, ...]; the logits are
        then the mixture's log-probabilities. Without it they are the network's own (what preflight's checks of
        the network test); scoring, training and generation pass it whenever the option is on."""
        hidden = self.final_hidden(inputs, cache)
        logits = self.expert_logits(hidden, prior)
        loss = None
        if targets is not None:
            batch, time = targets.shape
            loss = F.cross_entropy(logits.reshape(batch * time, -1).float(), targets.reshape(batch * time))
        return logits, loss

    def expert_logits(self, hidden: torch.Tensor, prior: Prior | None) -> torch.Tensor:
        """The head's logits of final hidden states, mixed with `prior` by the gate when one is given."""
        logits = self.head(hidden)
        if prior is None:
            return logits
        if self.expert_gate is None:
            raise ValueError("a prior was passed to a model built without model.ngram_expert")
        return mixed_log_probs(logits, self.expert_gate(hidden), prior)

    def final_hidden(self, inputs: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The final LayerNorm's output [B, T, C] (what the head and the expert's gate read)."""
        batch, time = inputs.shape
        start = cache.length if cache is not None else 0
        if start + time > self.config.block_size:
            raise ValueError(f"sequence length {start + time} exceeds block_size {self.config.block_size}")
        x = self.tok_emb(inputs)
        if self.ngram_emb is not None:
            history = cache.tokens if cache is not None else None
            x = x + self.ngram_emb(inputs, history)
            if cache is not None:  # the n-grams of the next positions reach back ngram_orders - 1 tokens
                seen = inputs if history is None else torch.cat([history, inputs], dim=1)
                cache.tokens = seen[:, -(self.config.ngram_orders - 1):]
        rotary = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + time, device=inputs.device))
        else:
            rotary = (self.rotary_cos[start:start + time], self.rotary_sin[start:start + time])
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, rotary)
        hidden = self.ln_f(x)
        if cache is not None:
            cache.length += time
            cache.last_hidden = hidden[:, -1:, :]
        return hidden

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
        prior_of: PriorOf | None = None,
    ) -> torch.Tensor:
        """inputs [B, T] with max_new_tokens sampled IDs appended (eval mode; see generate_stream)."""
        settings = SamplingSettings(temperature, top_k, top_p, repetition_penalty)
        return torch.cat([inputs, *self.generate_stream(inputs, max_new_tokens, settings, generator, prior_of)],
                         dim=1)

    @torch.no_grad()
    def generate_stream(self, inputs: torch.Tensor, max_new_tokens: int, settings: SamplingSettings,
                        generator: torch.Generator | None = None, prior_of: PriorOf | None = None):
        """Yield the sampled IDs [B, 1] one at a time, with a KV cache: a new token costs one position, not a
        forward pass over the whole window. Positions are absolute, so the window cannot slide one token at a time
        under a cache: when it is full it restarts from its last block_size // 2 tokens (one forward pass), so a
        token sees between block_size // 2 and block_size - 1 tokens of context once the text is longer than
        the window (the prompt is cropped to the last block_size tokens).

        prior_of (required under model.ngram_expert): the n-gram's distribution of the next token after the text so
        far ([B, T] IDs -> a Prior of [B, 1, ...])."""
        settings.validate(self.config.vocab_size, "sampling")
        if (prior_of is None) != (self.expert_gate is None):
            raise ValueError("generation under model.ngram_expert needs the n-gram (prior_of), and only then")
        block = self.config.block_size
        was_training = self.training
        self.eval()
        try:
            out = inputs
            cache, logits = self._prefill(out[:, -block:])
            for produced in range(1, max_new_tokens + 1):
                # only the last position predicts the next token
                if prior_of is not None:
                    logits = self.expert_logits(cache.last_hidden, prior_of(out))
                scores = next_token_logits(logits[:, -1, :], out[:, -block:], settings)
                next_id = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)
                out = torch.cat([out, next_id], dim=1)
                yield next_id
                if produced == max_new_tokens:
                    break
                if cache.length == block:  # the window is full: restart it from its second half
                    cache, logits = self._prefill(out[:, -max(1, block // 2):])
                else:
                    logits, _ = self(next_id, cache=cache)
        finally:
            self.train(was_training)

    def _prefill(self, context: torch.Tensor) -> tuple[KVCache, torch.Tensor]:
        cache = KVCache(len(self.blocks))
        logits, _ = self(context, cache=cache)
        return cache, logits
