"""The budget shapes (conf/shape/) and the tokens-per-parameter rule `make machine` picks one by (the command itself
and what a run does with its choice: tests/test_machine_choice.py)."""

import pytest

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose
from minigpt.core.config import load_params
from minigpt.core.errors import ConfigError
from minigpt.train import shape_choice
from minigpt.train.shape_choice import ShapeTiming, pick_shape

SMALL, PRODUCTION = 832_000, 3_253_248  # the two budget shapes' parameters (wt2-mini vocabulary)


def shapes(small_tok_s: float, production_tok_s: float) -> list[ShapeTiming]:
    return [ShapeTiming("production", PRODUCTION, production_tok_s), ShapeTiming("small", SMALL, small_tok_s)]


@pytest.mark.parametrize("machine,budget_s,small_tok_s,production_tok_s,expected", [
    # the measurements the rule was calibrated on (docs/data-and-config.md, "Budget shapes"): each shape's tokens/s as
    # preflight timed it
    ("AMD EPYC avx512_bf16, 72 s", 72, 34_474, 12_211, "small"),
    ("AMD EPYC avx512_bf16, 15 min", 900, 28_016, 11_153, "production"),
    ("Intel Xeon AMX, 72 s", 72, 28_400, 11_400, "small"),
    ("Intel Xeon AMX, 15 min", 900, 28_400, 11_400, "production"),
    ("AMD EPYC with slow bf16 (the issue's), 72 s", 72, 16_000, 5_700, "small"),
    ("AMD EPYC with slow bf16 (the issue's), 15 min", 900, 16_000, 5_700, "small"),
])
def test_the_rule_reproduces_the_measured_winners(machine, budget_s, small_tok_s, production_tok_s, expected):
    assert pick_shape(shapes(small_tok_s, production_tok_s), budget_s, 2.0) == expected, machine


def test_the_rule_takes_the_largest_shape_that_sees_enough_tokens_per_parameter():
    timings = [ShapeTiming("a", 1_000, 100.0), ShapeTiming("b", 10_000, 100.0), ShapeTiming("c", 100_000, 100.0)]
    # in 1000 s: a sees 100 tokens/parameter, b 10, c 1
    assert pick_shape(timings, 1000, 5.0) == "b"
    assert pick_shape(timings, 1000, 1.0) == "c"
    assert pick_shape(timings, 1000, 50.0) == "a"
    assert pick_shape(timings, 1000, 500.0) == "a", "none sees enough: the smallest trains"
    assert pick_shape(timings[::-1], 1000, 5.0) == "b", "the order the shapes are listed in does not matter"
    with pytest.raises(ValueError):
        pick_shape([], 1000, 1.0)


def test_budget_shapes_need_a_clock(project):
    root, source = project
    refusal = "'budget.shapes' lists shapes to choose from but 'train.max_seconds' is null"
    with pytest.raises(ConfigError, match=refusal):
        recompose(root, source, ["budget.shapes=[small]"])


def shaped(tmp_path, preset: str, shape: str):
    """A budget preset composed with `shape` forced (and no machine choice: nothing here depends on the CPU)."""
    from minigpt.core.compose import compose_params

    out = tmp_path / f"{preset}-{shape}.yaml"
    compose_params(out, REPO_ROOT / "conf", [f"experiment={preset}", "machine=none", f"shape={shape}",
                                             "train.precision=fp32"])
    return load_params(out)


# what conf/experiment/budget-72s.yaml adds to either shape (docs/decisions.md, "N-gram input embeddings at 72 s")
# the 72-second preset's n-gram tables and its n-gram expert
NGRAM_TABLES_72S = {"ngram_orders": 4, "ngram_buckets": 2048, "ngram_expert": True}


def test_budget_presets_choose_among_the_calibrated_shapes(tmp_path):
    from minigpt.core.compose import compose_params

    compose_params(tmp_path / "default.yaml", REPO_ROOT / "conf", ["machine=none", "train.precision=fp32"])
    default = load_params(tmp_path / "default.yaml")
    assert default.shape is None and default.budget.shapes == []
    short = shaped(tmp_path, "budget-72s", "small")
    assert short.budget.shapes == ["small", "production"] and short.budget.min_tokens_per_parameter == 2.0
    assert short.shape == "small" and short.model.embedding_dim == 128 and short.train.lr == 0.003
    production = shaped(tmp_path, "budget-72s", "production")
    # the production model as composed, with the options that won (docs/data-and-config.md, "Model options") and the
    # 72-second preset's n-gram tables and expert
    assert production.model.model_dump() == {**default.model.model_dump(), "position": "rotary", "qk_norm": True,
                                             "mlp": "swiglu", **NGRAM_TABLES_72S}
    assert {short.train.optimizer, production.train.optimizer} == {"muon"}
    assert shaped(tmp_path, "budget-15m", "small").budget.shapes == ["small-regularised", "production"]


def test_the_15_minute_small_shape_is_the_72_second_one_with_dropout(tmp_path):
    """budget-15m's small shape adds dropout off the attention weights (its 15 minutes are ~7 passes over wt2-mini
    and overfit without it) and keeps every other key of the small shape; the preset adds the weight average, and
    only the 72-second preset has the n-gram tables and the n-gram expert, batches of 32 windows (16 at 15 minutes)
    and none of its loss on the soft targets (0.3 at 15 minutes: its n-gram is taught, not mixed in)."""
    short, long = shaped(tmp_path, "budget-72s", "small"), shaped(tmp_path, "budget-15m", "small-regularised")
    short_model, long_model = short.model.model_dump(), long.model.model_dump()
    assert short_model["dropout"] == 0.0 and long_model["dropout"] == 0.1
    assert short_model["attention_dropout"] and not long_model["attention_dropout"]
    assert {**long_model, "dropout": 0.0, "attention_dropout": True, **NGRAM_TABLES_72S} == short_model
    short_train, long_train = short.train.model_dump(), long.train.model_dump()
    assert long_train["max_seconds"] == 900 and long_train["ema_decay"] == 0.999 and short_train["ema_decay"] is None
    assert long_train["distill_alpha"] == 0.3 and short_train["distill_alpha"] == 0.0
    assert long_train["batch_size"] == 16 and short_train["batch_size"] == 32
    assert {**long_train, "max_seconds": 72, "ema_decay": None, "distill_alpha": 0.0, "batch_size": 32} == short_train
    long_production = shaped(tmp_path, "budget-15m", "production").model.model_dump()
    assert {**long_production, **NGRAM_TABLES_72S} == shaped(tmp_path, "budget-72s", "production").model.model_dump()


def test_describe_names_every_shape_and_the_choice():
    record = {"choice": "small", "budget_seconds": 72.0, "min_tokens_per_parameter": 2.0, "shapes": {
        "small": {"parameters": SMALL, "tokens_per_s": 32000.0, "precision": "bf16", "tokens_per_parameter": 2.769},
        "production": {"parameters": PRODUCTION, "tokens_per_s": 11000.0, "precision": "bf16",
                       "tokens_per_parameter": 0.243}}}
    line = shape_choice.describe(record)
    assert line.startswith("small (in 72 s: small 832,000 parameters at 32,000 tokens/s (bf16) = 2.77 tokens/parameter")
    assert "production 3,253,248 parameters" in line and ">= 2" in line
