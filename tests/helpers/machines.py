"""Fake CPUs for tests whose outcome depends on the CPU's bf16 instructions."""

from minigpt.core.machine import CpuInfo

WITH_BF16 = CpuInfo("a CPU with bf16 instructions", "6/143", frozenset({"sse2", "avx2", "avx512f", "avx512_bf16"}))
AVX2_ONLY = CpuInfo("a CPU without bf16 instructions", "25/1", frozenset({"sse2", "avx2"}))

# the small budget shape at fixture scale (written over conf/shape/small.yaml of a copy of conf/)
TINY_SMALL = """# @package _global_
shape: small
model: {block_size: 32, embedding_dim: 32, num_heads: 2, num_layers: 1, dropout: 0.0, position: rotary,
        qk_norm: true, mlp: swiglu, attention_precision: fp32}
train: {batch_size: 8, lr: 0.01, warmup_steps: 5, betas: [0.9, 0.99], eval_batches: 2, optimizer: muon, grad_clip: 2.0}
"""
