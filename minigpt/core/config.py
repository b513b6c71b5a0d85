"""Typed schema for params.yaml (pydantic v2), validated before any stage does work.

params.yaml is composed from conf/ by Hydra (via `dvc exp run` or `make params`); stages read it through
`load_params`, which turns pydantic's errors into one line that names the key, what was wrong and what is
allowed — e.g. `params.yaml: 'train.lr' = -0.001 is invalid; it must be > 0`. Every section is strict (no
string-to-number coercion; an integer is accepted where a number is expected), frozen, and forbids unknown keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from minigpt.core.config_errors import explain
from minigpt.core.errors import ConfigError

DEFAULT_PARAMS = "params.yaml"
# generation costs one forward pass of up to block_size positions per character: a bound that still means minutes
MAX_NEW_TOKENS = 100_000


def _must(text: str, **constraints) -> Any:
    """A constrained field; `text` is what the value must be, as the error message says it."""
    return Field(description=text, **constraints)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class DataConfig(Section):
    source: Literal["wikitext2", "local"]
    path: Optional[str]
    mirrors: list[str]
    timeout_s: float = _must("> 0", gt=0)
    attempts: int = _must(">= 1", ge=1)
    retry_backoff_s: float = _must(">= 0", ge=0)

    @model_validator(mode="after")
    def _local_needs_a_path(self):
        if self.source == "local" and not self.path:
            raise ValueError("'data.path' is required with data=local; pass the directory or zip, e.g. "
                             "dvc exp run -S data=local -S data.path=/abs/path/to/wikitext.")
        return self


class CleanConfig(Section):
    unicode_form: Literal["NFC", "NFKC", "NFD", "NFKD", "none"]
    min_char_count: int = _must(">= 1", ge=1)
    placeholder: str = _must("exactly one character, not a newline")
    detokenize_markup: bool

    @field_validator("placeholder")
    @classmethod
    def _one_character(cls, value: str) -> str:
        if len(value) != 1 or value == "\n":
            raise ValueError("not one character")
        return value


class TokenizerConfig(Section):
    kind: Literal["char", "bpe"]
    # bpe: the IDs, the 256 bytes and the special tokens included; char: null (the characters of clean train)
    vocab_size: Optional[int]
    special_tokens: list[str]

    @model_validator(mode="after")
    def _bpe_needs_a_size(self):
        if self.kind == "bpe" and (self.vocab_size is None or self.vocab_size < 256 + len(self.special_tokens)):
            raise ValueError("'tokenizer.vocab_size' must be at least 256 + the special tokens for tokenizer=bpe "
                             "(byte-level BPE starts from the 256 bytes), e.g. -S tokenizer.vocab_size=512")
        if self.kind == "char" and (self.vocab_size is not None or self.special_tokens):
            raise ValueError("tokenizer=char takes its vocabulary from clean train: leave 'tokenizer.vocab_size' null "
                             "and 'tokenizer.special_tokens' empty (or choose tokenizer=bpe)")
        return self


class ModelConfig(Section):
    block_size: int = _must(">= 1", ge=1)
    embedding_dim: int = _must(">= 1", ge=1)
    num_heads: int = _must(">= 1", ge=1)
    num_layers: int = _must(">= 1", ge=1)
    expansion_factor: int = _must(">= 1", ge=1)
    dropout: float = _must("in [0, 1)", ge=0, lt=1)
    # Options beyond the guide's MiniGPT (docs/data-and-config.md, "Model options"; tied embeddings and bias-free layers
    # were measured and dropped there); the defaults build the guide's model, and a checkpoint written before these
    # keys existed loads as that model.
    # learned: a position embedding table; rotary: q and k rotated by their position (no table)
    position: Literal["learned", "rotary"] = "learned"
    # true: q and k RMS-normalised per head before attention (parameter-free)
    qk_norm: bool = False
    # gelu: fc -> GELU -> proj; relu2: fc -> ReLU squared -> proj; swiglu: SiLU(gate) * up -> proj, hidden width
    # 2/3 of expansion_factor * embedding_dim (rounded up to a multiple of 32): about the same parameters
    mlp: Literal["gelu", "relu2", "swiglu"] = "gelu"
    # false: dropout on the embeddings and residual branches only, not on the attention weights (on a CPU,
    # attention dropout keeps scaled_dot_product_attention off its fused kernel)
    attention_dropout: bool = True
    # step: attention in the training step's precision; fp32: a bf16 step computes attention in fp32 (on a CPU,
    # scaled_dot_product_attention's fused backward is many times slower in bf16 than in fp32; no effect in fp32)
    attention_precision: Literal["step", "fp32"] = "step"
    # 0: off; n >= 2: the hashes of the 2 .. n tokens ending at each position look up learned vectors added to its
    # embedding (minigpt.model.ngram_embedding), ngram_buckets rows per order
    ngram_orders: int = Field(0, ge=0, description="0 (off) or >= 2")
    ngram_buckets: int = Field(4096, ge=1, description=">= 1")
    # true: the next-token distribution mixed with stage soft_targets' n-gram by a learned gate of the final hidden
    # state (minigpt.model.ngram_expert); needs soft_targets.order > 0
    ngram_expert: bool = False

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.embedding_dim % self.num_heads:
            divisors = [h for h in range(1, self.embedding_dim + 1) if self.embedding_dim % h == 0]
            raise ValueError(
                f"'model.embedding_dim' = {self.embedding_dim} is not divisible by 'model.num_heads' = "
                f"{self.num_heads}; allowed num_heads for this width: {', '.join(map(str, divisors))}.")
        if self.ngram_orders == 1:
            raise ValueError("'model.ngram_orders' = 1 would hash single tokens, which the token embedding already "
                             "looks up; use 0 (off) or 2 and more.")
        if self.position == "rotary" and (self.embedding_dim // self.num_heads) % 2:
            raise ValueError(
                f"'model.position' = 'rotary' needs an even head width, but embedding_dim {self.embedding_dim} / "
                f"num_heads {self.num_heads} = {self.embedding_dim // self.num_heads}; change num_heads or the width.")
        return self


class TrainConfig(Section):
    max_steps: int = _must(">= 1", ge=1)
    # a wall-clock budget for the loop (steps, periodic evals, checkpoints); null: max_steps alone decides
    max_seconds: Optional[float] = _must("> 0 (or null for no time limit)", gt=0)
    batch_size: int = _must(">= 1", ge=1)
    lr: float = _must("> 0", gt=0)
    min_lr: Optional[float] = _must(">= 0 (or null for 10% of lr)", ge=0)
    warmup_steps: int = _must(">= 0", ge=0)
    weight_decay: float = _must(">= 0", ge=0)
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = _must("two values in [0, 1)", min_length=2, max_length=2)
    grad_clip: float = _must("> 0", gt=0)
    eval_every: int = _must(">= 1", ge=1)
    eval_batches: int = _must(">= 1", ge=1)
    seed: int
    sample_prompt: str = _must("a non-empty string", min_length=1)
    sample_length: int = _must(">= 0", ge=0)
    device: Literal["auto", "cpu", "cuda", "mps"]
    # auto: `make machine` measures which is faster here and composes it in (conf/machine/); a stage refuses an
    # auto that is still auto (minigpt.train.machine_choice)
    precision: Literal["fp32", "bf16", "auto"]
    compile: bool
    resume_from: Optional[str]
    # adamw: AdamW for every parameter. muon: Muon (torch.optim.Muon, its update scaled to AdamW's RMS) for the
    # blocks' matrices, AdamW for embeddings, head, gains and biases; both at the schedule's LR and weight_decay
    optimizer: Literal["adamw", "muon"] = "adamw"
    # null: evaluate and keep the trained weights. A number in (0, 1): the run evaluates, keeps as its best checkpoint
    # and samples from an exponential moving average of the trained weights with this decay (about 1 / (1 - decay)
    # steps of memory; minigpt.train.weight_average)
    ema_decay: Optional[float] = _must("in (0, 1) (or null for no average)", gt=0, lt=1, default=None)
    # the weight of the soft targets (stage soft_targets: a cross-fitted n-gram's next-token distribution) in the
    # training loss, (1 - a) CE(one-hot) + a CE(soft); 0: the one-hot targets alone (minigpt.train.distill)
    distill_alpha: float = _must("in [0, 1)", ge=0, lt=1, default=0.0)

    @model_validator(mode="after")
    def _schedule_fits(self):
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(f"'train.min_lr' = {self.min_lr} is above 'train.lr' = {self.lr}; it must be <= lr.")
        if self.warmup_steps >= self.max_steps:
            raise ValueError(f"'train.warmup_steps' = {self.warmup_steps} is not below 'train.max_steps' = "
                             f"{self.max_steps}; the run would never reach its peak LR. Lower warmup_steps or raise "
                             "max_steps.")
        return self


class PreflightConfig(Section):
    seed: int
    batch_size: int = _must(">= 1", ge=1)
    initial_loss_tolerance: float = _must("> 0", gt=0)
    rehearsal_warmup_max: int = _must(">= 0", ge=0)
    rehearsal_steps: int = _must(">= 5 (one window of the running median)", ge=5)
    probe_batches: int = _must(">= 1", ge=1)
    lr_rise_tolerance: float = _must("> 0", gt=0)
    learn_margin: float = _must(">= 0", ge=0)
    overfit_steps: int = _must(">= 1", ge=1)
    overfit_lr: float = _must("> 0", gt=0)
    overfit_batch_size: int = _must(">= 1", ge=1)
    overfit_threshold: float = _must("> 0", gt=0)
    # the model single_batch_overfit trains whatever the run's model (conf/config.yaml composes the guide's debug
    # model here)
    overfit_model: ModelConfig


class EvaluateConfig(Section):
    stride: Optional[int] = _must(">= 1 and <= model.block_size (or null for block_size // 2)", ge=1)
    batch_size: int = _must(">= 1", ge=1)
    precision: Literal["fp32", "bf16", "auto"]
    # dynamic evaluation (minigpt.evaluate.dynamic): a separate figure where the model learns on each split as it
    # scores it; the static val/test bpc are unchanged by it
    dynamic: bool
    dynamic_lr: float = _must("> 0", gt=0)
    dynamic_streams: int = _must(">= 1", ge=1)
    # the model mixed with a Kneser-Ney n-gram of this order counted on train (minigpt.evaluate.mixture): a separate
    # figure; 0 leaves it out
    mixture_order: int = _must("0 (off) or in [1, 16]", ge=0, le=16)
    # the uncertainty of val/test bpc (minigpt.evaluate.intervals): the scored targets cut into `blocks` contiguous
    # blocks (kept in reports/eval_blocks.json), resampled `bootstrap_resamples` times from `bootstrap_seed`
    blocks: int = _must(">= 2", ge=2)
    bootstrap_resamples: int = _must(">= 100", ge=100)
    bootstrap_seed: int = _must(">= 0", ge=0)


class WatchConfig(Section):
    """The training loop's watchdogs (minigpt.train.watchdogs); docs/preflight.md, "Watchdogs" says how each was
    calibrated."""
    lr_rtol: float = _must("> 0", gt=0)
    dead_grad_steps: int = _must(">= 1", ge=1)
    first_evals: int = _must(">= 2", ge=2)
    val_margin: float = _must(">= 0", ge=0)
    rising_evals: int = _must(">= 1", ge=1)
    rise_tolerance: float = _must(">= 0", ge=0)
    window: int = _must(">= 1", ge=1)
    settle_steps: int = _must(">= 0", ge=0)
    clip_share_max: float = _must("in [0, 1]", ge=0, le=1)
    throughput_fraction: float = _must("in (0, 1]", gt=0, le=1)
    max_repeat_share: float = _must("in [0, 1]", ge=0, le=1)
    max_placeholder_share: float = _must("in [0, 1]", ge=0, le=1)


class BaselinesConfig(Section):
    # orders of the interpolated Kneser-Ney character n-grams (all counted in one pass)
    ngram_orders: list[Annotated[int, Field(ge=1, le=16)]] = _must("a non-empty list of orders in [1, 16]",
                                                                   min_length=1)
    discount: float = _must("in (0, 1]", gt=0, le=1)
    # 0 leaves PPMd out of the ladder
    ppmd_order: int = _must("0 (off) or in [2, 64]", ge=0, le=64)
    ppmd_mem_mb: int = _must("between 1 and 2048", ge=1, le=2048)

    @field_validator("ppmd_order")
    @classmethod
    def _ppmd_order_in_range(cls, value: int) -> int:
        if value == 1:
            raise ValueError("PPMd needs order >= 2")
        return value


class SoftTargetsConfig(Section):
    """Stage soft_targets (minigpt.data.soft_targets): every train position's next-token distribution from a
    Kneser-Ney n-gram of this order (baselines.discount) counted without that position's fold, its top tokens kept."""
    order: int = _must("0 (build none) or in [1, 16]", ge=0, le=16)
    top: int = _must("in [1, 64]", ge=1, le=64)
    folds: int = _must("in [2, 20]", ge=2, le=20)


class GenerateConfig(Section):
    prompts: list[Annotated[str, Field(min_length=1)]] = _must("a non-empty list of non-empty prompts", min_length=1)
    max_new_tokens: int = _must(f"between 1 and {MAX_NEW_TOKENS}", ge=1, le=MAX_NEW_TOKENS)
    temperature: float = _must("> 0", gt=0)
    top_k: Optional[int] = _must(">= 1 (or null for no limit)", ge=1)
    top_p: float = _must("in (0, 1]", gt=0, le=1)
    repetition_penalty: float = _must(">= 1 (1 disables it)", ge=1)
    seed: int


class BudgetConfig(Section):
    # the budget shapes (conf/shape/) `make machine` times for a preset with a clock; empty: no shape is chosen
    shapes: list[str]
    min_tokens_per_parameter: float = _must("> 0", gt=0)


class MachineConfig(Section):
    """A choice `make machine` measured on one machine and composed in (conf/machine/<file>.yaml): the values it
    sets (train.precision, and a budget preset's shape) are in the train and model sections like any other;
    this record says where they came from, so a run can refuse a choice made elsewhere
    (minigpt.train.machine_choice)."""
    file: str = _must("the conf/machine/ file the choice is stored in", min_length=1)
    # what the choice was measured on (minigpt.core.machine.machine_label); null: not measured yet
    label: Optional[str]
    # digest of the configuration it timed (minigpt.train.machine_choice.timed_digest); null: nothing needed timing
    timed: Optional[str]
    shape: Optional[str]
    precision: Literal["fp32", "bf16"]
    # the chosen configuration's measured training tokens/s (the throughput watchdog's reference); null: not timed
    tokens_per_s: Optional[float] = _must("> 0 (or null)", gt=0)
    # how it was chosen, in one line (the console, the report and the run page)
    how: str


class Params(Section):
    data: DataConfig
    tokenizer: TokenizerConfig
    model: ModelConfig
    train: TrainConfig
    watch: WatchConfig
    clean: CleanConfig
    preflight: PreflightConfig
    evaluate: EvaluateConfig
    baselines: BaselinesConfig
    generate: GenerateConfig
    budget: BudgetConfig
    soft_targets: SoftTargetsConfig
    # the budget shape composed in (conf/shape/), null: none
    shape: Optional[str]
    # the machine's measured choice composed in (conf/machine/), null: none (every value set by hand)
    machine: Optional[MachineConfig]

    @model_validator(mode="after")
    def _distillation_has_targets(self):
        if self.train.distill_alpha > 0 and self.soft_targets.order == 0:
            raise ValueError(f"'train.distill_alpha' = {self.train.distill_alpha} needs soft targets, but "
                             "'soft_targets.order' is 0 (none built); set soft_targets.order (e.g. 7) or "
                             "train.distill_alpha=0.")
        return self

    @model_validator(mode="after")
    def _expert_has_an_ngram(self):
        if self.model.ngram_expert and self.soft_targets.order == 0:
            raise ValueError("'model.ngram_expert' = true mixes the output with the soft targets' n-gram, but "
                             "'soft_targets.order' is 0 (none built); set soft_targets.order (e.g. 9) or "
                             "model.ngram_expert=false.")
        return self

    @model_validator(mode="after")
    def _budget_has_a_clock(self):
        if self.budget.shapes and self.train.max_seconds is None:
            raise ValueError("'budget.shapes' lists shapes to choose from but 'train.max_seconds' is null: a shape is "
                             "chosen by the tokens this machine trains in that budget; set train.max_seconds (or use "
                             "experiment=budget-72s / budget-15m).")
        return self

    @model_validator(mode="after")
    def _stride_fits_the_window(self):
        stride = self.evaluate.stride
        if stride is not None and stride > self.model.block_size:
            raise ValueError(f"'evaluate.stride' = {stride} exceeds 'model.block_size' = {self.model.block_size}; "
                             "it must be between 1 and block_size (or null for block_size // 2).")
        return self

    def section_dict(self, name: str) -> dict[str, Any]:
        return getattr(self, name).model_dump()

    def uses_soft_targets(self) -> bool:
        """Whether the run reads stage soft_targets' n-gram: trained towards it (train.distill_alpha > 0) or mixed
        with it (model.ngram_expert)."""
        return self.train.distill_alpha > 0 or self.model.ngram_expert


def _validated(raw: dict, source: str) -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(explain(exc.errors()[0], raw, source, Params)) from None


def params_from_dict(raw: Any, source: str = DEFAULT_PARAMS) -> Params:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(raw).__name__}.")
    return _validated(raw, source)


def _read_yaml(path: Path, fix: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"{path}: not found. {fix}")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}). {fix}") from None


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    path = Path(path)
    raw = _read_yaml(path, "Generate it from conf/ with `make params` (or run `dvc exp run`).")
    return params_from_dict(raw, str(path))
