import copy
import subprocess
import sys

import pytest
import yaml

from helpers import REPO_ROOT
from minigpt.core.compose import compose_params
from minigpt.core.config import load_params, params_from_dict
from minigpt.core.errors import ConfigError


def _committed():
    return yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def test_params_yaml_is_the_composition_of_conf(tmp_path):
    """params.yaml must be exactly what `dvc exp run` would compose from conf/ (drift check)."""
    out = tmp_path / "params.yaml"
    compose_params(out, REPO_ROOT / "conf", [])
    assert out.read_text() == (REPO_ROOT / "params.yaml").read_text(), (
        "params.yaml differs from conf/: run `make params` and commit it"
    )


def test_debug_experiment_switches_model_and_training_to_debug_scale(tmp_path):
    out = tmp_path / "params.yaml"
    compose_params(out, REPO_ROOT / "conf", ["experiment=debug"])
    params = load_params(out)
    assert (params.model.block_size, params.model.embedding_dim, params.model.num_heads) == (32, 64, 4)
    assert (params.model.num_layers, params.model.expansion_factor, params.model.dropout) == (2, 4, 0.0)
    assert params.train.batch_size == 8 and params.train.max_steps == 200


@pytest.mark.parametrize("preset,seconds", [("budget-72s", 72), ("budget-15m", 900)])
def test_time_budget_presets_compose_to_clock_limited_runs(tmp_path, preset, seconds):
    out = tmp_path / "params.yaml"
    compose_params(out, REPO_ROOT / "conf", [f"experiment={preset}"])
    params = load_params(out)
    assert params.train.max_seconds == seconds and params.train.precision in ("fp32", "bf16")
    assert params.shape == params.machine.shape and params.shape in params.budget.shapes
    tokens = params.train.max_steps * params.train.batch_size * params.model.block_size
    assert tokens / 100_000 > 10 * seconds, "even at 100k tokens/s (3x this CPU's fastest) the clock must end the run"


@pytest.mark.parametrize("overrides,batch,steps", [([], 8, 40), (["experiment=budget-15m"], 8, 40),
                                                   (["experiment=budget-72s"], 4, 20),
                                                   (["experiment=budget-72s", "tokenizer=bpe"], 8, 200)])
def test_the_72_second_preset_shortens_preflight_unless_bpe_needs_a_long_rehearsal(tmp_path, overrides, batch, steps):
    out = tmp_path / "params.yaml"
    compose_params(out, REPO_ROOT / "conf", overrides)
    pre = load_params(out).preflight
    assert (pre.batch_size, pre.rehearsal_steps, pre.rehearsal_warmup_max) == (batch, steps, 20)


def test_committed_params_validate():
    params = load_params(REPO_ROOT / "params.yaml")
    assert params.data.source == "wikitext2" and params.data.path is None


@pytest.mark.parametrize(
    "section,key,value,expected",
    [
        ("train", "lr", 0, "'train.lr' = 0 is invalid; it must be > 0"),
        ("train", "lr", -1e-3, "'train.lr' = -0.001 is invalid"),
        ("train", "lr", "fast", "'train.lr' = 'fast' has the wrong type"),
        ("model", "dropout", 1.0, "'model.dropout' = 1.0 is invalid; it must be in [0, 1)"),
        ("model", "dropout", -0.1, "'model.dropout'"),
        ("model", "block_size", 0, "'model.block_size' = 0 is invalid; it must be >= 1"),
        ("model", "num_layers", 2.5, "'model.num_layers' = 2.5 has the wrong type"),
        ("model", "num_heads", 3,
         "not divisible by 'model.num_heads' = 3; allowed num_heads for this width: 1, 2, 4, 8"),
        ("train", "precision", "fp16", "expected one of 'fp32', 'bf16', 'auto'"),
        ("train", "compile", 1, "'train.compile' = 1 has the wrong type"),
        ("train", "max_seconds", 0, "'train.max_seconds' = 0 is invalid; it must be > 0 (or null for no time limit)"),
        ("clean", "unicode_form", "NFX", "one of 'NFC', 'NFKC', 'NFD', 'NFKD', 'none'"),
        ("clean", "placeholder", "??", "exactly one character"),
        ("train", "seed", True, "'train.seed' = True has the wrong type or value; expected an integer"),
        ("train", "lr", float("nan"), "'train.lr' = nan has the wrong type or value; expected a number"),
        ("train", "betas", [0.9, 1.5], "'train.betas' = [0.9, 1.5] is invalid; it must be two values in [0, 1)"),
        ("train", "betas", [0.9], "'train.betas' = [0.9] is invalid"),
        ("train", "warmup_steps", 5000, "'train.warmup_steps' = 5000 is not below 'train.max_steps' = 5000"),
        ("train", "min_lr", 0.5, "'train.min_lr' = 0.5 is above 'train.lr' = 0.001"),
        ("evaluate", "stride", 500, "'evaluate.stride' = 500 exceeds 'model.block_size' = 128"),
        ("generate", "prompts", ["The", ""],
         "'generate.prompts' = ['The', ''] is invalid; it must be a non-empty list"),
        ("generate", "max_new_tokens", 10**6, "it must be between 1 and 100000"),
    ],
)
def test_invalid_values_are_named_with_the_rule(section, key, value, expected):
    raw = _committed()
    raw[section][key] = value
    with pytest.raises(ConfigError) as err:
        params_from_dict(raw)
    assert expected in str(err.value)


def test_unknown_key_lists_allowed_keys():
    raw = _committed()
    raw["model"]["embed_dim"] = 64
    with pytest.raises(ConfigError,
                       match=r"unknown key 'model.embed_dim'. Allowed keys in 'model': block_size, embedding_dim"):
        params_from_dict(raw)


def test_missing_key_and_unknown_section():
    raw = _committed()
    del raw["train"]["lr"]
    with pytest.raises(ConfigError, match="missing key 'train.lr'"):
        params_from_dict(raw)
    raw = _committed()
    raw["optimizer"] = {}
    with pytest.raises(ConfigError, match="unknown section 'optimizer'"):
        params_from_dict(raw)


def test_local_data_needs_a_path():
    raw = copy.deepcopy(_committed())
    raw["data"]["source"] = "local"
    with pytest.raises(ConfigError, match="'data.path' is required with data=local"):
        params_from_dict(raw)


def test_stage_exits_nonzero_on_invalid_config_and_writes_nothing(tmp_path):
    raw = _committed()
    raw["model"]["num_heads"] = 5
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "stages" / "fetch.py")], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "model.embedding_dim" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()
