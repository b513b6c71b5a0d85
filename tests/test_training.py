"""The train stage: the gate, the loop's records, checkpoints, kill-and-resume, the NaN guard, DDP."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose, record_as_written
from minigpt.core.errors import MinigptError
from minigpt.model import batch_loss
from minigpt.model.checkpoint import CheckpointError, load_checkpoint
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.suite import run_preflight
from minigpt.train.loop import TrainingDiverged, train
from minigpt.train.run_control import TrainingStopped

FAST = ["train.max_steps=40", "train.eval_every=10", "train.eval_batches=2", "train.sample_length=10"]


# Bit-for-bit comparisons of two trainer processes pin their thread count: a float sum split over 1 or 2 threads
# rounds differently in the last bit (measured: 1 vs 2 threads part at step 6 of a 150-step debug run), and the
# default share of the cores changes when another minigpt process on the machine starts or ends. Built per call:
# the environment then holds the test's own worker registry (conftest's autouse fixture).
def same_threads() -> dict:
    return {**os.environ, "MINIGPT_THREADS": os.environ.get("MINIGPT_THREADS", "2")}


def stage(root, *args, **kwargs):
    return subprocess.run([sys.executable, str(REPO_ROOT / "stages/train.py"), *args], cwd=root, capture_output=True,
                          text=True, **kwargs)


def read_log(root):
    return [json.loads(line) for line in (root / "reports/train_log.jsonl").read_text().splitlines()]


def test_train_refuses_without_a_passing_current_report(project):
    root, source = project
    recompose(root, source, FAST)
    result = stage(root)
    assert result.returncode == 1 and "no debug report" in result.stderr and "dvc repro preflight" in result.stderr
    run_preflight(recompose(root, source, FAST + ["train.lr=1.0"]), root)
    result = stage(root)
    assert result.returncode == 1 and "preflight failed (lr_stability)" in result.stderr
    run_preflight(recompose(root, source, FAST), root)
    recompose(root, source, FAST + ["train.lr=0.002"])
    result = stage(root)
    assert result.returncode == 1 and "mismatched fingerprint: config (train.lr)" in result.stderr
    assert not (root / "models").exists() or not any((root / "models").iterdir())


def test_a_gated_run_logs_every_step_and_writes_its_outputs(project):
    root, source = project
    params = recompose(root, source, FAST)
    run_preflight(params, root)
    result = stage(root)
    assert result.returncode == 0, result.stderr
    log = read_log(root)
    assert [r["step"] for r in log] == list(range(1, 41))
    assert {"step", "train_loss", "lr", "grad_norm", "tokens_per_sec", "elapsed_s"} <= set(log[0])
    evals = [r for r in log if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40] and all("sample" in r for r in evals)
    assert log[0]["lr"] == pytest.approx(params.train.lr / params.train.warmup_steps)
    for name in ["models/mini_gpt_latest.pt", "models/mini_gpt_best.pt", "reports/train_curves.png",
                 "reports/plots/train.csv", "reports/plots/val.csv", "reports/train_summary.json"]:
        assert (root / name).is_file(), name
    assert (root / "reports/plots/train.csv").read_text().splitlines()[0] == "step,train_loss,lr,grad_norm"
    metrics = json.loads((root / "reports/train_summary.json").read_text())
    assert metrics["steps"] == 40 and 0 <= metrics["clipped_fraction"] <= 1
    assert metrics["best_val_loss"] == pytest.approx(min(r["val_loss"] for r in evals), abs=1e-6)
    ckpt = load_checkpoint(root / "models/mini_gpt_latest.pt")
    for key in ["model_state_dict", "optimizer_state_dict", "step", "best_val_loss", "rng", "batch_rng", "config",
                "tokenizer_fingerprint", "log_steps", "log_sha256"]:
        assert key in ckpt, key
    assert {"torch", "numpy", "python"} <= set(ckpt["rng"]) and ckpt["step"] == 40


def test_every_evaluation_of_a_run_scores_the_same_validation_batches(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    seen = []
    real = batch_loss.evaluate_model

    def recording(model, val_batches, precision="fp32"):
        seen.append([(x.clone(), y.clone()) for x, y in val_batches])
        return real(model, val_batches, precision)

    monkeypatch.setattr(batch_loss, "evaluate_model", recording)
    train(params, root, require_gate=False, out=lambda _m: None)
    assert len(seen) == 4 and len(seen[0]) == params.train.eval_batches
    assert all(torch.equal(x, x0) and torch.equal(y, y0)
               for probe in seen[1:] for (x, y), (x0, y0) in zip(probe, seen[0]))
    assert all(torch.equal(x[:, 1:], y[:, :-1]) for x, y in seen[0])


def _wait_for_step(root, step, proc, timeout=60):
    log = root / "reports/train_log.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.is_file():
            lines = log.read_text().splitlines()
            if len(lines) >= step:
                return
        if proc.poll() is not None:
            raise AssertionError("training ended before it could be killed")
        time.sleep(0.01)
    raise AssertionError("training did not reach the step in time")


@pytest.mark.slow
def test_killed_run_resumes_and_reproduces_the_uninterrupted_weights(project, tmp_path):
    root, source = project
    overrides = ["train.max_steps=400", "train.eval_every=50", "train.eval_batches=2", "train.sample_length=0",
                 "model.dropout=0.1"]
    params = recompose(root, source, overrides)
    run_preflight(params, root)
    import shutil
    twin = shutil.copytree(root, tmp_path / "twin")

    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "stages/train.py")], cwd=root, env=same_threads(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_step(root, 170, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(read_log(root))
    assert killed_at < 400
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] in range(150, 400, 50)

    resumed = stage(root, env=same_threads())
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout
    uninterrupted = stage(twin, env=same_threads())
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    a = load_checkpoint(root / "models/mini_gpt_latest.pt")["model_state_dict"]
    b = load_checkpoint(twin / "models/mini_gpt_latest.pt")["model_state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    steps = [r["step"] for r in read_log(root)]
    assert steps == list(range(1, 401)), "the resumed log must read as one run"
    assert [r["train_loss"] for r in read_log(root)] == [r["train_loss"] for r in read_log(twin)]


def test_resume_from_a_checkpoint_of_other_settings(project):
    root, source = project
    params = recompose(root, source, FAST)
    train(params, root, require_gate=False, out=lambda _m: None)
    other = recompose(root, source, FAST + ["train.weight_decay=0.05"])
    messages = []
    train(other, root, require_gate=False, out=messages.append)
    assert any("not resuming" in m for m in messages)
    explicit = recompose(root, source,
                         FAST + ["train.weight_decay=0.01", f"train.resume_from={root / 'models/mini_gpt_latest.pt'}"])
    with pytest.raises(CheckpointError, match="train.resume_from: .* other data/model/training settings"):
        train(explicit, root, require_gate=False, out=lambda _m: None)


class NanAtStep25(MiniGPT):
    """Corrupts one weight during the 25th training forward pass."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = 0

    def forward(self, inputs, targets=None, cache=None):
        if self.training:
            self.calls += 1
            if self.calls == 25:
                with torch.no_grad():
                    self.blocks[0].mlp.fc.weight[0, 0] = float("nan")
        return super().forward(inputs, targets, cache)


def test_nan_guard_names_step_module_and_keeps_the_last_checkpoint(project):
    root, source = project
    params = recompose(root, source, FAST)
    with pytest.raises(TrainingDiverged) as err:
        train(params, root, require_gate=False, model_factory=NanAtStep25, out=lambda _m: None)
    message = str(err.value)
    assert "non-finite loss nan at step 25 (last finite step 24)" in message
    assert "first module with non-finite output: 'blocks.0.mlp.fc'" in message
    assert "(step 20) is left intact" in message
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] == 20
    assert [r["step"] for r in read_log(root)][-1] == 24


def test_nan_guard_stops_an_absurd_learning_rate(project):
    root, source = project
    params = recompose(root, source, FAST + ["train.lr=1e30", "train.warmup_steps=0"])
    with pytest.raises(TrainingDiverged, match=r"non-finite .* at step \d+ \(last finite step \d+\)"):
        train(params, root, require_gate=False, out=lambda _m: None)


def test_unwritable_models_folder_is_a_clear_error(project):
    root, source = project
    params = recompose(root, source, FAST)
    (root / "models").write_text("not a folder")
    with pytest.raises(MinigptError, match="models/ is not writable"):
        train(params, root, require_gate=False, out=lambda _m: None)


@pytest.mark.slow
def test_two_process_ddp_run(project):
    root, source = project
    params = recompose(root, source,
                       ["train.max_steps=20", "train.warmup_steps=5", "train.eval_every=10", "train.eval_batches=2",
                                      "train.sample_length=0"])
    run_preflight(params, root)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(REPO_ROOT / "stages/train.py")], cwd=root, capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("[train] done:") == 1, "rank 0 alone reports"
    assert [r["step"] for r in read_log(root)] == list(range(1, 21))
    metrics = json.loads((root / "reports/train_summary.json").read_text())
    assert metrics["world_size"] == 2
    ckpt = load_checkpoint(root / "models/mini_gpt_latest.pt")
    assert len(ckpt["batch_rng"]) == 2 and not torch.equal(ckpt["batch_rng"][0], ckpt["batch_rng"][1])


def test_time_budget_stops_the_run_and_decays_the_lr_on_the_clock(project):
    root, source = project
    params = recompose(root, source, ["train.max_steps=1000000", "train.max_seconds=3", "train.eval_every=100000",
                                      "train.eval_batches=2", "train.sample_length=0", "train.warmup_steps=5"])
    summary = train(params, root, require_gate=False, out=lambda _m: None)
    log = read_log(root)
    assert summary["stopped_by"] == "max_seconds" and 5 < summary["steps"] < 1_000_000
    assert [r["step"] for r in log] == list(range(1, summary["steps"] + 1))
    # (elapsed_s is logged to the millisecond, so a step just under 3 s reads as 3.0)
    assert log[-2]["elapsed_s"] <= 3.0 <= log[-1]["elapsed_s"], "stops on the first step past the budget"
    assert "val_loss" in log[-1], "the last step is evaluated and checkpointed"
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] == summary["steps"]
    lrs = [r["lr"] for r in log[5:]]
    assert all(a >= b for a, b in zip(lrs, lrs[1:])) and lrs[-1] < 0.15 * params.train.lr, \
        "after warmup the LR follows the clock down to min_lr (10% of lr)"


@pytest.mark.slow
def test_time_budget_under_ddp_stops_every_rank_at_the_same_step(project):
    root, source = project
    params = recompose(root, source, ["train.max_steps=1000000", "train.max_seconds=4", "train.eval_every=100000",
                                      "train.eval_batches=2", "train.sample_length=0"])
    run_preflight(params, root)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(REPO_ROOT / "stages/train.py")], cwd=root, capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # a rank left behind would hang until the timeout
    metrics = json.loads((root / "reports/train_summary.json").read_text())
    assert metrics["stopped_by"] == "max_seconds" and metrics["world_size"] == 2
    assert read_log(root)[-1]["step"] == metrics["steps"]


# ------------------------------------------------------------------------------------- stopping and the lock

@pytest.mark.slow
@pytest.mark.parametrize("signum,code,name", [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_ctrl_c_or_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes_bitwise(
        project, tmp_path, signum, code, name):
    root, source = project
    params = recompose(root, source, ["train.max_steps=150", "train.eval_every=50", "train.eval_batches=2",
                                      "train.sample_length=0", "model.dropout=0.1"])
    run_preflight(params, root)
    import shutil
    twin = shutil.copytree(root, tmp_path / "twin")

    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "stages/train.py")], cwd=root, env=same_threads(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(root, 70, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    stopped_at = len(read_log(root))
    assert lines == [f"[train] stopped at step {stopped_at} ({name}); models/mini_gpt_latest.pt holds that step. "
                     "Resume with `dvc repro` (or `python stages/train.py`): the run continues where it stopped, as "
                     "if never interrupted."]
    assert 70 <= stopped_at < 150
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] == stopped_at
    assert not (root / "models/.train.lock").exists(), "the lock is released on a stop"

    assert stage(root, env=same_threads()).returncode == 0
    assert stage(twin, env=same_threads()).returncode == 0
    assert [r["step"] for r in read_log(root)] == list(range(1, 151))
    assert [r["train_loss"] for r in read_log(root)] == [r["train_loss"] for r in read_log(twin)]
    resumed, straight = (load_checkpoint(p / "models/mini_gpt_latest.pt")["model_state_dict"] for p in (root, twin))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_a_second_trainer_on_the_same_folder_is_refused_naming_the_holder(project):
    root, source = project
    params = recompose(root, source, ["train.max_steps=100000", "train.eval_every=100000", "train.eval_batches=2",
                                      "train.sample_length=0"])
    run_preflight(params, root)
    first = subprocess.Popen([sys.executable, str(REPO_ROOT / "stages/train.py")], cwd=root,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(root, 5, first)
        second = stage(root)
        assert second.returncode == 1
        assert f"another trainer is running on this folder (pid {first.pid} on" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert read_log(root)[0]["step"] == 1, "the second trainer wrote nothing"
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143 and not (root / "models/.train.lock").exists()


def test_a_stale_lock_and_half_written_temp_files_are_cleared(project):
    root, source = project
    params = recompose(root, source, FAST)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (root / "models").mkdir(exist_ok=True)
    (root / "models/.train.lock").write_text(json.dumps({"pid": gone.pid, "start": "1",
                                                         "host": __import__("socket").gethostname()}))
    leftover = root / "models/.mini_gpt_best.pt.k3j2h1.tmp"
    leftover.write_bytes(b"half a checkpoint")
    messages = []
    train(params, root, require_gate=False, out=messages.append)
    assert not leftover.exists() and any(f"removed {leftover}" in m for m in messages)
    assert not (root / "models/.train.lock").exists()


def test_a_checkpoint_write_that_fails_mid_run_names_the_path_and_keeps_the_last_good_one(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    from minigpt.model import checkpoint as checkpoint_module
    real_write, calls = checkpoint_module.atomic_write_bytes, []

    def disk_full_after_two(path, data):  # a simulation; the real full disk is the tmpfs test below
        calls.append(path)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", disk_full_after_two)
    with pytest.raises(CheckpointError,
                       match=r"mini_gpt_\w+\.pt: could not write the checkpoint \(No space left on device\); "
                                              "the previous one is left as it was"):
        train(params, root, require_gate=False, out=lambda _m: None)
    monkeypatch.undo()
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] == 10
    assert not list((root / "models").glob(".*.tmp")) and not (root / "models/.train.lock").exists()


def train_with_a_fault_after_the_first_checkpoint(root, params, monkeypatch, fault, out=lambda _m: None):
    """Train until the first checkpoint is written, then call `fault()` (the folder turns read-only, the disk
    fills); the CheckpointError the run ends with."""
    from minigpt.train import run_state

    real_save, done = run_state.save_checkpoint, []

    def save_then_fault(path, *args, **kwargs):
        real_save(path, *args, **kwargs)
        if not done:
            done.append(fault())

    monkeypatch.setattr(run_state, "save_checkpoint", save_then_fault)
    with pytest.raises(CheckpointError) as err:
        train(params, root, require_gate=False, out=out)
    monkeypatch.undo()
    return err.value, done[0]


def test_models_turning_read_only_mid_run_ends_in_the_checkpoint_message_not_a_lock_traceback(project, monkeypatch):
    """The real condition: `chattr +i models` after the first checkpoint (as a full quota or a read-only remount
    does). The next checkpoint write fails for real; the run ends with that one message, and the lock it cannot
    remove any more is said in a line, not raised over it."""
    root, source = project
    params = recompose(root, source, FAST)
    models, messages = root / "models", []
    try:
        error, frozen = train_with_a_fault_after_the_first_checkpoint(
            root, params, monkeypatch, lambda: subprocess.run(["chattr", "+i", str(models)], capture_output=True,
                                                              text=True), messages.append)
    finally:
        subprocess.run(["chattr", "-i", str(models)], capture_output=True)
    if frozen.returncode:
        pytest.skip(f"chattr +i refused here ({frozen.stderr.strip()}); the test needs root on ext4/xfs")
    assert "could not write the checkpoint (Operation not permitted); the previous one is left as it was" in str(error)
    assert any(m.startswith(f"[train] could not remove the run lock {models / '.train.lock'} (Operation not "
                            "permitted)") for m in messages), messages
    assert load_checkpoint(models / "mini_gpt_best.pt")["step"] == 10, "the checkpoint written before is intact"


def test_a_real_full_disk_during_a_checkpoint_write_keeps_the_last_good_one(project, monkeypatch):
    """models/ on a small tmpfs, filled after the first checkpoint: the next write meets a real ENOSPC."""
    from helpers.filesystems import fill, small_disk

    root, source = project
    params = recompose(root, source, FAST)
    models = root / "models"
    with small_disk(models, spare_bytes=8 << 20):
        error, _ = train_with_a_fault_after_the_first_checkpoint(root, params, monkeypatch, lambda: fill(models))
        assert "could not write the checkpoint (No space left on device); the previous one is left as it was" in str(
            error)
        assert len(str(error).splitlines()) == 1
        assert load_checkpoint(models / "mini_gpt_best.pt")["step"] == 10, "the checkpoint written before is intact"
        assert not list(models.glob(".*.tmp")) and not (models / ".train.lock").exists()


def test_resuming_from_a_pickle_payload_names_what_it_holds(project):
    import pickle

    root, source = project
    payload = root / "models/payload.pt"
    payload.parent.mkdir(exist_ok=True)
    payload.write_bytes(pickle.dumps({"model_state_dict": os.system}, protocol=4))
    params = recompose(root, source, FAST + [f"train.resume_from={payload}"])
    with pytest.raises(CheckpointError, match=rf"it holds pickled Python objects \({os.system.__module__}\.system\)"):
        train(params, root, require_gate=False, out=lambda _m: None)


def test_a_val_split_too_short_for_one_window_is_a_clear_error_before_training(project):
    root, source = project
    params = recompose(root, source, FAST)
    np_val = root / "data/encoded/val.npy"
    import numpy as np
    np.save(np_val, np.load(np_val)[: params.model.block_size])
    record_as_written(root, "encode", np_val)
    with pytest.raises(MinigptError, match=r"val.npy: 32 tokens, fewer than one window of model.block_size \+ 1 = 33"):
        train(params, root, require_gate=False, out=lambda _m: None)
    assert not (root / "reports/train_log.jsonl").exists()


def test_a_trainer_whose_parent_dies_stops_cleanly_instead_of_running_on_as_an_orphan(project, tmp_path):
    """`dvc repro` killed but not its child: the orphan would keep writing models/ beside the next run."""
    root, source = project
    run_preflight(recompose(root, source, ["train.max_steps=100000", "train.eval_every=100000", "train.eval_batches=2",
                                           "train.sample_length=0"]), root)
    err = tmp_path / "trainer.err"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(REPO_ROOT / 'stages/train.py')!r}], cwd={str(root)!r},"
        f" stdout=subprocess.DEVNULL, stderr=open({str(err)!r}, 'w'))\n"
        "time.sleep(600)\n")])
    _wait_for_step(root, 5, parent)
    parent.kill()
    parent.wait()
    deadline = time.time() + 60
    while (root / "models/.train.lock").exists() and time.time() < deadline:
        time.sleep(0.1)
    assert not (root / "models/.train.lock").exists(), "the orphan stopped and released the lock"
    message = err.read_text()
    assert f"(parent process {parent.pid} exited); models/mini_gpt_latest.pt holds that step" in message
    assert load_checkpoint(root / "models/mini_gpt_latest.pt")["step"] == len(read_log(root))


# ------------------------------------------------------------------------------ the log is the run's history

def _stop_at_the_eval_of(step):
    """An `out` callback that sends this process SIGINT when the run reports the val loss of `step`."""
    def out(message):
        if message.startswith(f"[train] step {step}: val loss"):
            os.kill(os.getpid(), signal.SIGINT)
    return out


def test_checkpoints_hold_no_history_and_a_resumed_run_keeps_the_logged_steps(project):
    root, source = project
    params = recompose(root, source, FAST)
    with pytest.raises(TrainingStopped):
        train(params, root, require_gate=False, out=_stop_at_the_eval_of(20))
    ckpt = load_checkpoint(root / "models/mini_gpt_latest.pt")
    assert "history" not in ckpt and ckpt["step"] == 20 and ckpt["log_steps"] == 20
    logged = read_log(root)
    assert [r["step"] for r in logged] == list(range(1, 21))

    messages = []
    train(params, root, require_gate=False, out=messages.append)
    assert any("resuming from" in m for m in messages)
    resumed = read_log(root)
    assert [r["step"] for r in resumed] == list(range(1, 41)) and resumed[:20] == logged


def test_a_log_that_does_not_match_the_checkpoint_is_restarted_and_said(project):
    root, source = project
    params = recompose(root, source, FAST)
    with pytest.raises(TrainingStopped):
        train(params, root, require_gate=False, out=_stop_at_the_eval_of(20))
    log = root / "reports/train_log.jsonl"
    records = read_log(root)
    records[3]["train_loss"] += 1.0  # as many steps, other content: e.g. another run's log
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    messages = []
    train(params, root, require_gate=False, out=messages.append)
    assert any("reports/train_log.jsonl does not hold the steps of" in m and "start at step 21" in m for m in messages)
    assert [r["step"] for r in read_log(root)] == list(range(21, 41))
