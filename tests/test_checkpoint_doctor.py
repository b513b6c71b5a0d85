"""Checkpoints load strictly or fail loudly; the doctor diagnoses trained weights."""

import re
import subprocess
import sys

import pytest
import torch

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose
from helpers.tiny_models import small_config, train_quickly
from minigpt.core.paths import TOKENIZER_FILE
from minigpt.data.tokenizer import CharTokenizer
from minigpt.evaluate.doctor import main as doctor_main
from minigpt.evaluate.generation import main as generate_main
from minigpt.model.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_state_strict,
    model_from_checkpoint,
    save_checkpoint,
)
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train.loop import train
from minigpt.train.optim import build_param_groups


def test_checkpoint_round_trip_is_weights_only(tmp_path):
    model = MiniGPT(small_config())
    path = tmp_path / "models" / "ckpt.pt"
    save_checkpoint(path, model, "f" * 64, step=3)
    loaded = load_checkpoint(path)
    assert loaded["step"] == 3 and loaded["config"] == model.config.model_dump()
    other = MiniGPT(small_config())
    load_state_strict(other, loaded)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"], "no temp file left behind"


def test_a_trained_checkpoint_loads_the_way_the_guides_script_reads_it(project):
    """debug_mini_gpt.py: MiniGPTConfig(**ckpt["config"]), load_state_dict(ckpt["model_state_dict"]), and
    PyTorch's tutorial: optimizer.load_state_dict(ckpt["optimizer_state_dict"]), ckpt["step"]."""
    root, source = project
    params = recompose(root, source,
                       ["train.max_steps=10", "train.warmup_steps=2", "train.eval_every=10", "train.eval_batches=2",
                                      "train.sample_length=0"])
    train(params, root, require_gate=False, out=lambda _m: None)
    ckpt = torch.load(root / "models/mini_gpt_latest.pt", map_location="cpu", weights_only=True)
    model = MiniGPT(MiniGPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model_state_dict"])
    optimizer = torch.optim.AdamW(build_param_groups(model, params.train.weight_decay), lr=params.train.lr)
    optimizer.load_state_dict(ckpt["optimizer_state_dict"])
    assert ckpt["step"] == 10 and model.config.vocab_size == CharTokenizer.load(root / TOKENIZER_FILE).vocab_size
    assert "history" not in ckpt, "the loss history lives in reports/train_log.jsonl, not in every checkpoint"


def test_a_checkpoint_in_the_old_layout_is_converted_on_load(tmp_path):
    model = MiniGPT(small_config())
    path = tmp_path / "old.pt"
    legacy = {"model_state": model.state_dict(), "model_config": model.config.model_dump(),
              "tokenizer_fingerprint": "f",
              "optimizer_state": {"state": {}, "param_groups": []}, "step": 7, "history": [{"step": 1}]}
    torch.save(legacy, path)
    loaded = load_checkpoint(path)
    assert {"model_state_dict", "config", "optimizer_state_dict"} <= set(loaded) and "history" not in loaded
    assert not {"model_state", "model_config",
                "optimizer_state"} & set(loaded) and loaded["upgraded_from_legacy_layout"]
    rebuilt = model_from_checkpoint(loaded)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values()))


def test_a_checkpoint_config_that_is_not_a_model_is_named(tmp_path):
    model = MiniGPT(small_config())
    path = tmp_path / "odd.pt"
    save_checkpoint(path, model, "f")
    payload = load_checkpoint(path)
    payload["config"]["num_heads"] = 5
    with pytest.raises(CheckpointError, match="invalid config: .*'model.embedding_dim' = 32 is not divisible"):
        model_from_checkpoint(payload, source=str(path))
    payload["config"]["num_heads"] = "four"
    with pytest.raises(CheckpointError, match="invalid config: num_heads: Input should be a valid integer"):
        model_from_checkpoint(payload, source=str(path))


class Payload:
    """An arbitrary object: unpickling it would run the class's code path."""


def test_pickled_objects_are_refused_in_one_line_that_never_suggests_unsafe_loading(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model_state_dict": {}, "config": {}, "tokenizer_fingerprint": "", "obj": Payload()}, path)
    with pytest.raises(CheckpointError, match="not a minigpt checkpoint: it holds pickled Python objects") as err:
        load_checkpoint(path)
    assert "weights_only" not in str(err.value) and len(str(err.value).splitlines()) == 1


class RunsCode:
    """A pickle payload: unpickling it calls os.system, which would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_pickle_payload_is_named_by_what_it_would_call_and_never_runs(tmp_path, writer, capsys):
    """Not "damaged": the message names the global the loader refused (here os.system), for evaluate, generate,
    the doctor and resume alike (they all load through load_checkpoint)."""
    import os
    import pickle

    marker = tmp_path / "ran"
    path = tmp_path / "models/mini_gpt_best.pt"
    path.parent.mkdir()
    payload = {"model_state_dict": {}, "config": {}, "tokenizer_fingerprint": "", "obj": RunsCode(marker)}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=4))
    expected = f"it holds pickled Python objects ({os.system.__module__}.system)"
    with pytest.raises(CheckpointError, match=re.escape(expected)) as err:
        load_checkpoint(path)
    assert "damaged" not in str(err.value) and "weights_only" not in str(err.value)
    assert doctor_main(["--checkpoint", str(path)]) != 0
    assert expected in capsys.readouterr().err
    assert generate_main(["--prompt", "The ", "--checkpoint", str(path), "--params", str(REPO_ROOT / "params.yaml"),
                          "--root", str(tmp_path)]) != 0
    assert expected in capsys.readouterr().err
    assert not marker.exists(), "the payload's code ran"


@pytest.mark.parametrize("payload,message", [
    (torch.zeros(3), "it holds a Tensor, not a dictionary of fields"),
    ({"model_state_dict": {"w": 1.0}, "config": {}, "tokenizer_fingerprint": "f"},
     "'model_state_dict' holds non-tensor entries: w"),
    ({"model_state_dict": [torch.zeros(1)], "config": {}, "tokenizer_fingerprint": "f"},
     "'model_state_dict' is a list"),
    ({"model_state_dict": {}, "tokenizer_fingerprint": "f"}, "it lacks 'config'"),
    (b"garbage", "not a loadable checkpoint (the file is damaged or is not a checkpoint)"),
])
def test_files_that_are_not_minigpt_checkpoints_are_named_clearly(tmp_path, payload, message):
    path = tmp_path / "odd.pt"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        torch.save(payload, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    "change,expected",
    [
        (dict(vocab=41), ["vocab_size: model 41 vs checkpoint 40", "size mismatches",
                          "tok_emb.weight: checkpoint (40, 32) vs model (41, 32)"]),
        (dict(embedding_dim=64), ["embedding_dim: model 64 vs checkpoint 32", "size mismatches"]),
        (dict(num_layers=3), ["num_layers: model 3 vs checkpoint 2", "missing keys", "blocks.2.attn.qkv.weight"]),
        (dict(num_layers=1), ["num_layers: model 1 vs checkpoint 2", "unexpected keys", "blocks.1.ln1.weight"]),
    ],
)
def test_loading_into_another_architecture_lists_what_differs(tmp_path, change, expected):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, MiniGPT(small_config()), "f" * 64)
    vocab = change.pop("vocab", 40)
    target = MiniGPT(small_config(vocab, **change))
    with pytest.raises(CheckpointError) as err:
        load_state_strict(target, load_checkpoint(path), path)
    for text in expected:
        assert text in str(err.value)


def test_doctor_passes_a_trained_checkpoint_and_flags_an_untrained_one(project, capsys):
    root, source = project
    recompose(root, source, [])
    model, tok = train_quickly(root, 250)
    save_checkpoint(root / "models/trained.pt", model, tok.fingerprint)
    args = ["--params", str(root / "params.yaml"), "--root", str(root)]
    assert doctor_main(["--checkpoint", str(root / "models/trained.pt"), *args]) == 0
    assert "trained_loss           PASSED" in capsys.readouterr().out

    fresh, _ = train_quickly(root, 0)
    save_checkpoint(root / "models/fresh.pt", fresh, tok.fingerprint)
    assert doctor_main(["--checkpoint", str(root / "models/fresh.pt"), *args]) == 1
    out = capsys.readouterr()
    assert "trained_loss           FAILED" in out.out and "not clearly below the random baseline" in out.out


def test_doctor_refuses_a_checkpoint_from_another_tokenizer(project):
    root, source = project
    recompose(root, source, [])
    model, _ = train_quickly(root, 0)
    save_checkpoint(root / "models/other.pt", model, "0" * 64)
    result = subprocess.run([sys.executable, "-m", "minigpt.evaluate.doctor", "--checkpoint", "models/other.pt"],
                            cwd=root,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "trained with tokenizer 0000000000000000" in result.stderr and "Traceback" not in result.stderr
