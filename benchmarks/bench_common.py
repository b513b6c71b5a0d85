"""What the benchmark scripts share: model presets from conf/, and the FLOP count used for MFU."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minigpt.config import ModelConfig  # noqa: E402
from minigpt.model import MiniGPTConfig  # noqa: E402


def model_preset(name: str, vocab: int) -> MiniGPTConfig:
    """conf/model/<name>.yaml as a MiniGPTConfig for a vocabulary of `vocab` characters."""
    values = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return MiniGPTConfig.from_params(ModelConfig(**values), vocab)


def flops_per_token(config: MiniGPTConfig, params: int) -> float:
    """Training FLOPs per token: 6 x parameters, plus attention scores and values (12 x layers x T x width)."""
    return 6 * params + 12 * config.num_layers * config.block_size * config.embedding_dim
