"""budget.choose_shape: preflight times the budget shapes on this machine, the tokens-per-parameter rule picks one,
the report records the timings and the choice, the gate binds it, and train trains exactly that shape."""

import pytest

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose, run_stage
from minigpt.core.config import load_params
from minigpt.core.errors import ConfigError
from minigpt.preflight.suite import run_preflight
from minigpt.train import shape_choice
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train
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


def test_choose_shape_needs_a_clock_and_valid_shapes(tmp_path, project):
    root, source = project
    with pytest.raises(ConfigError, match="'budget.choose_shape' is true but 'train.max_seconds' is null"):
        recompose(root, source, ["budget.choose_shape=true"])
    with pytest.raises(ConfigError, match=r"budget.shapes.small: 'model.dropout' = 1.5 is invalid"):
        recompose(root, source, ["experiment=budget-72s", "budget.shapes.small.model.dropout=1.5"])
    with pytest.raises(ConfigError, match=r"budget.shapes.small: unknown key 'model.width'"):
        recompose(root, source, ["experiment=budget-72s", "+budget.shapes.small.model.width=3"])
    with pytest.raises(ConfigError, match=r"'budget.shapes.small.train.max_seconds' is not allowed"):
        recompose(root, source, ["experiment=budget-72s", "+budget.shapes.small.train.max_seconds=3"])


# two shapes small enough for the fixture: "small" (1 layer, width 32) and "production" (2 layers, width 64)
TINY_SHAPES = ["experiment=budget-72s", "train.max_steps=20", "train.eval_every=10", "train.eval_batches=2",
               "train.sample_length=0", "train.precision=fp32", "train.warmup_steps=5",
               "preflight.overfit_steps=30", "preflight.overfit_threshold=5.0",
               "budget.shapes.small.model.num_layers=1", "budget.shapes.small.model.embedding_dim=32",
               "budget.shapes.small.model.block_size=32", "budget.shapes.small.train.warmup_steps=5",
               "budget.shapes.small.train.lr=0.01",
               "+budget.shapes.production.model.num_layers=2", "+budget.shapes.production.model.embedding_dim=64",
               "+budget.shapes.production.model.block_size=32", "+budget.shapes.production.train.lr=0.003"]


@pytest.mark.parametrize("max_seconds,expected", [(1e6, "production"), (1e-3, "small")])
def test_preflight_picks_the_shape_the_report_binds_and_train_trains_it(project, max_seconds, expected):
    root, source = project
    params = recompose(root, source, [*TINY_SHAPES, f"train.max_seconds={max_seconds}"])
    run_stage(root, "soft_targets")  # the preset's soft targets (soft_targets.order 7)
    report = run_preflight(params, root)
    assert report["passed"], report["failed"]
    record = report["shape"]
    assert record["choice"] == expected and set(record["shapes"]) == {"small", "production"}
    seconds = report["seconds"]
    assert seconds["timings"] >= record["seconds"] - 0.01, "the shapes' timings are preflight's timings"
    assert seconds["preflight"] >= seconds["total"] + seconds["timings"] - 0.01
    for measured in record["shapes"].values():
        assert measured["tokens_per_s"] > 0 and measured["precision"] == "fp32"
        assert measured["tokens_per_parameter"] == pytest.approx(
            measured["tokens_per_s"] * max_seconds / measured["parameters"], rel=1e-3, abs=1e-3)
    chosen = params.with_shape(expected)
    assert report["config"]["model"] == chosen.section_dict("model"), "the checks ran on the chosen shape"
    lines = []
    summary = train(params, root, out=lines.append)
    assert summary["model"] == chosen.section_dict("model")
    assert summary["parameters"] == record["shapes"][expected]["parameters"]
    assert any(line.startswith(f"[train] budget shape: {expected} (") for line in lines)


def test_the_gate_refuses_a_report_made_for_other_shapes_or_another_rule(project):
    root, source = project
    params = recompose(root, source, [*TINY_SHAPES, "train.max_seconds=1000000"])
    run_stage(root, "soft_targets")
    assert run_preflight(params, root)["passed"]
    verify_gate(params, root)
    for change, named in (("budget.min_tokens_per_parameter=50", "budget.min_tokens_per_parameter"),
                          ("budget.shapes.small.model.embedding_dim=48", "budget.shapes"),
                          ("train.max_seconds=500", "train.max_seconds")):
        other = recompose(root, source, [*TINY_SHAPES, "train.max_seconds=1000000", change])
        with pytest.raises(GateError, match=f"mismatched fingerprint: config \\(.*{named}"):
            verify_gate(other, root)


def test_training_without_the_gate_refuses_to_guess_a_shape(project):
    root, source = project
    params = recompose(root, source, [*TINY_SHAPES, "train.max_seconds=10"])
    with pytest.raises(ConfigError, match="budget.choose_shape is true: the shape is chosen by preflight"):
        train(params, root, require_gate=False, out=lambda _m: None)


@pytest.mark.parametrize("preset", ["budget-72s", "budget-15m"])
def test_budget_presets_choose_among_the_calibrated_shapes(tmp_path, preset):
    from minigpt.core.compose import compose_params

    compose_params(tmp_path / "params.yaml", REPO_ROOT / "conf", [f"experiment={preset}"])
    params = load_params(tmp_path / "params.yaml")
    assert params.budget.choose_shape and set(params.budget.shapes) == {"small", "production"}
    assert params.budget.min_tokens_per_parameter == 2.0
    assert params.with_shape("small").model.embedding_dim == 128
    production = params.with_shape("production").model
    # the production model as composed, with the options that won (docs/data-and-config.md, "Model options")
    assert production.model_dump() == {**params.model.model_dump(), "position": "rotary", "qk_norm": True,
                                       "mlp": "swiglu"}
    assert {params.with_shape(name).train.optimizer for name in ("small", "production")} == {"muon"}


def test_the_15_minute_small_shape_is_the_72_second_one_with_dropout(tmp_path):
    """budget-15m sets only the small shape's dropout, off the attention weights (its 15 minutes are ~7 passes over
    wt2-mini and overfit without it), and the moving average of the weights; the nested override must keep every
    other key of the shape conf/budget/default.yaml defines."""
    from minigpt.core.compose import compose_params

    def shapes_of(preset: str) -> tuple:
        compose_params(tmp_path / f"{preset}.yaml", REPO_ROOT / "conf", [f"experiment={preset}"])
        params = load_params(tmp_path / f"{preset}.yaml")
        small = params.with_shape("small")
        return small.model.model_dump(), small.train.model_dump(), params.with_shape("production").model.model_dump()

    (short_model, short_train, short_production) = shapes_of("budget-72s")
    (long_model, long_train, long_production) = shapes_of("budget-15m")
    assert short_model["dropout"] == 0.0 and long_model["dropout"] == 0.1
    assert short_model["attention_dropout"] and not long_model["attention_dropout"]
    assert {**long_model, "dropout": 0.0, "attention_dropout": True} == short_model
    assert long_train["max_seconds"] == 900 and long_train["ema_decay"] == 0.999 and short_train["ema_decay"] is None
    assert {**long_train, "max_seconds": 72, "ema_decay": None} == short_train
    assert long_production == short_production, "the production shape is the same in both presets"


def test_describe_names_every_shape_and_the_choice():
    record = {"choice": "small", "budget_seconds": 72.0, "min_tokens_per_parameter": 2.0, "shapes": {
        "small": {"parameters": SMALL, "tokens_per_s": 32000.0, "precision": "bf16", "tokens_per_parameter": 2.769},
        "production": {"parameters": PRODUCTION, "tokens_per_s": 11000.0, "precision": "bf16",
                       "tokens_per_parameter": 0.243}}}
    line = shape_choice.describe(record)
    assert line.startswith("small (in 72 s: small 832,000 parameters at 32,000 tokens/s (bf16) = 2.77 tokens/parameter")
    assert "production 3,253,248 parameters" in line and ">= 2" in line
