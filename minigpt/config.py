"""Typed schema for params.yaml, validated before any stage does work.

params.yaml is composed from conf/ by Hydra (via `dvc exp run` or `make params`); stages read it through
`load_params`, which rejects unknown keys, wrong types and out-of-range values with one message that names
the key, what was wrong and the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from minigpt.errors import ConfigError

DEFAULT_PARAMS = "params.yaml"
# generation costs one forward pass of up to block_size positions per character: a bound that still means minutes
MAX_NEW_TOKENS = 100_000


def _rule(check, text: str) -> dict:
    """Field metadata: a predicate on the value and the human text of what it must satisfy."""
    return {"rule": (check, text)}


def _positive(value) -> bool:
    return value > 0


def _at_least(bound):
    return lambda value: value >= bound


@dataclass(frozen=True)
class DataConfig:
    source: Literal["wikitext2", "local"]
    path: Optional[str]
    mirrors: list[str]
    timeout_s: float = field(metadata=_rule(_positive, "> 0"))
    attempts: int = field(metadata=_rule(_at_least(1), ">= 1"))
    retry_backoff_s: float = field(metadata=_rule(_at_least(0), ">= 0"))


@dataclass(frozen=True)
class CleanConfig:
    unicode_form: Literal["NFC", "NFKC", "NFD", "NFKD", "none"]
    min_char_count: int = field(metadata=_rule(_at_least(1), ">= 1"))
    placeholder: str = field(metadata=_rule(lambda v: len(v) == 1 and v != "\n", "exactly one character, not a newline"))
    detokenize_markup: bool


@dataclass(frozen=True)
class ModelConfig:
    block_size: int = field(metadata=_rule(_at_least(1), ">= 1"))
    embedding_dim: int = field(metadata=_rule(_at_least(1), ">= 1"))
    num_heads: int = field(metadata=_rule(_at_least(1), ">= 1"))
    num_layers: int = field(metadata=_rule(_at_least(1), ">= 1"))
    expansion_factor: int = field(metadata=_rule(_at_least(1), ">= 1"))
    dropout: float = field(metadata=_rule(lambda v: 0.0 <= v < 1.0, "in [0, 1)"))


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = field(metadata=_rule(_at_least(1), ">= 1"))
    # a wall-clock budget for the loop (steps, periodic evals, checkpoints); null: max_steps alone decides
    max_seconds: Optional[float] = field(metadata=_rule(_positive, "> 0 (or null for no time limit)"))
    batch_size: int = field(metadata=_rule(_at_least(1), ">= 1"))
    lr: float = field(metadata=_rule(_positive, "> 0"))
    min_lr: Optional[float] = field(metadata=_rule(_at_least(0), ">= 0 (or null for 10% of lr)"))
    warmup_steps: int = field(metadata=_rule(_at_least(0), ">= 0"))
    weight_decay: float = field(metadata=_rule(_at_least(0), ">= 0"))
    betas: list[float] = field(metadata=_rule(lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two values in [0, 1)"))
    grad_clip: float = field(metadata=_rule(_positive, "> 0"))
    eval_every: int = field(metadata=_rule(_at_least(1), ">= 1"))
    eval_batches: int = field(metadata=_rule(_at_least(1), ">= 1"))
    seed: int
    sample_prompt: str = field(metadata=_rule(lambda v: len(v) >= 1, "a non-empty string"))
    sample_length: int = field(metadata=_rule(_at_least(0), ">= 0"))
    device: Literal["auto", "cpu", "cuda", "mps"]
    precision: Literal["fp32", "bf16"]
    compile: bool
    resume_from: Optional[str]


@dataclass(frozen=True)
class PreflightConfig:
    seed: int
    batch_size: int = field(metadata=_rule(_at_least(1), ">= 1"))
    initial_loss_tolerance: float = field(metadata=_rule(_positive, "> 0"))
    rehearsal_warmup_max: int = field(metadata=_rule(_at_least(0), ">= 0"))
    rehearsal_steps: int = field(metadata=_rule(_at_least(5), ">= 5 (one window of the running median)"))
    probe_batches: int = field(metadata=_rule(_at_least(1), ">= 1"))
    lr_rise_tolerance: float = field(metadata=_rule(_positive, "> 0"))
    learn_margin: float = field(metadata=_rule(_at_least(0), ">= 0"))
    overfit_steps: int = field(metadata=_rule(_at_least(1), ">= 1"))
    overfit_lr: float = field(metadata=_rule(_positive, "> 0"))
    overfit_batch_size: int = field(metadata=_rule(_at_least(1), ">= 1"))
    overfit_threshold: float = field(metadata=_rule(_positive, "> 0"))


@dataclass(frozen=True)
class EvaluateConfig:
    stride: Optional[int] = field(metadata=_rule(_at_least(1), ">= 1 and <= model.block_size (or null for block_size // 2)"))
    batch_size: int = field(metadata=_rule(_at_least(1), ">= 1"))
    precision: Literal["fp32", "bf16"]


@dataclass(frozen=True)
class GenerateConfig:
    prompts: list[str] = field(metadata=_rule(lambda v: len(v) >= 1 and all(len(p) >= 1 for p in v), "a non-empty list of non-empty prompts"))
    max_new_tokens: int = field(metadata=_rule(lambda v: 1 <= v <= MAX_NEW_TOKENS, f"between 1 and {MAX_NEW_TOKENS}"))
    temperature: float = field(metadata=_rule(_positive, "> 0"))
    top_k: Optional[int] = field(metadata=_rule(_at_least(1), ">= 1 (or null for no limit)"))
    top_p: float = field(metadata=_rule(lambda v: 0 < v <= 1, "in (0, 1]"))
    repetition_penalty: float = field(metadata=_rule(_at_least(1), ">= 1 (1 disables it)"))
    seed: int


@dataclass(frozen=True)
class Params:
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    clean: CleanConfig
    preflight: PreflightConfig
    evaluate: EvaluateConfig
    generate: GenerateConfig

    def section_dict(self, name: str) -> dict[str, Any]:
        return dataclasses.asdict(getattr(self, name))


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _coerce(value, tp):
    """Return `value` as type `tp`, or raise TypeError. ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise TypeError
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(value, inner[0])
    if origin is list:
        if not isinstance(value, list):
            raise TypeError
        return [_coerce(item, typing.get_args(tp)[0]) for item in value]
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError
        return value
    raise TypeError


def _build_section(cls, raw, prefix: str, source: str):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: '{prefix}' must be a mapping with keys {', '.join(fields)}; got {raw!r}.")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key '{prefix}.{unknown[0]}'. Allowed keys in '{prefix}': {', '.join(fields)}. "
            "Fix the name in conf/ (or your -S override) and recompose params.yaml."
        )
    values = {}
    for name, fld in fields.items():
        key = f"{prefix}.{name}"
        if name not in raw:
            raise ConfigError(f"{source}: missing key '{key}' ({_type_name(hints[name])}). Add it to conf/ and recompose params.yaml.")
        try:
            value = _coerce(raw[name], hints[name])
        except TypeError:
            raise ConfigError(
                f"{source}: '{key}' = {raw[name]!r} has the wrong type or value; expected {_type_name(hints[name])}."
            ) from None
        rule = fld.metadata.get("rule")
        if rule is not None and value is not None and not rule[0](value):
            raise ConfigError(f"{source}: '{key}' = {raw[name]!r} is invalid; it must be {rule[1]}.")
        values[name] = value
    return cls(**values)


def params_from_dict(raw: dict, source: str = DEFAULT_PARAMS) -> Params:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}.")
    sections = {f.name: f.type for f in dataclasses.fields(Params)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(f"{source}: unknown section '{unknown[0]}'. Allowed sections: {', '.join(sections)}.")
    hints = typing.get_type_hints(Params)
    built = {}
    for name in sections:
        if name not in raw:
            raise ConfigError(f"{source}: missing section '{name}'. Recompose params.yaml from conf/ (make params).")
        built[name] = _build_section(hints[name], raw[name], name, source)
    params = Params(**built)
    _check_cross_field(params, source)
    return params


def _check_cross_field(params: Params, source: str) -> None:
    model = params.model
    if model.embedding_dim % model.num_heads:
        divisors = [h for h in range(1, model.embedding_dim + 1) if model.embedding_dim % h == 0]
        raise ConfigError(
            f"{source}: 'model.embedding_dim' = {model.embedding_dim} is not divisible by 'model.num_heads' = "
            f"{model.num_heads}; allowed num_heads for this width: {', '.join(map(str, divisors))}."
        )
    if params.data.source == "local" and not params.data.path:
        raise ConfigError(
            f"{source}: 'data.path' is required with data=local; pass the directory or zip, e.g. "
            "dvc exp run -S data=local -S data.path=/abs/path/to/wikitext."
        )
    stride = params.evaluate.stride
    if stride is not None and stride > model.block_size:
        raise ConfigError(f"{source}: 'evaluate.stride' = {stride} exceeds 'model.block_size' = {model.block_size}; "
                          "it must be between 1 and block_size (or null for block_size // 2).")
    train = params.train
    if train.min_lr is not None and train.min_lr > train.lr:
        raise ConfigError(f"{source}: 'train.min_lr' = {train.min_lr} is above 'train.lr' = {train.lr}; it must be <= lr.")


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: not found. Generate it from conf/ with `make params` (or run `dvc exp run`).")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}). Regenerate it with `make params`.") from None
    return params_from_dict(raw, str(path))
