"""Proof after training. The chain of custody: every stage from clean on records what it read, what it used and
what it wrote; each consumer checks its inputs against the producer's record, and the report stage verifies the
whole graph and refuses to write decision metrics from a broken link. Evaluation in evaluation mode, measured. The
bugs below are planted in the real stages, run in-process, and each is named by the stage that should notice."""

import json

import numpy as np
import pytest
import torch

from helpers.pipeline_fixture import copy_project, load_stage, recompose
from minigpt.core.provenance import CONSUMES, GRAPH_RECORD, RECORDS, values_digest
from minigpt.evaluate import baselines as baselines_module
from minigpt.evaluate import checkpoint_eval, scoring
from minigpt.model import batch_loss

FAST = ["train.max_steps=40", "train.warmup_steps=5", "train.eval_every=10", "train.eval_batches=2",
        "train.sample_length=0", "generate.max_new_tokens=40"]
DOWNSTREAM = ("preflight", "train", "evaluate", "generate", "report")


def run_stage(name, capsys) -> tuple[int, str]:
    stage = load_stage(name)
    code = stage.stage_main(name, stage.run, [])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture(scope="module")
def trained(encoded_project, tmp_path_factory):
    """A project through every stage (shared: the tests copy it before planting anything)."""
    import subprocess
    import sys

    from helpers import REPO_ROOT

    root, source = encoded_project
    root = copy_project(root, tmp_path_factory.mktemp("custody") / "project")
    recompose(root, source, FAST)
    for name in DOWNSTREAM:
        result = subprocess.run([sys.executable, str(REPO_ROOT / "stages" / f"{name}.py")], cwd=root,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    return root


@pytest.fixture
def run_copy(trained, tmp_path, monkeypatch):
    root = copy_project(trained, tmp_path / "project")
    monkeypatch.chdir(root)
    return root


def graph(root) -> dict:
    return json.loads((root / GRAPH_RECORD).read_text())


def broken(root) -> list[tuple[str, str, str]]:
    return [(link["producer"], link["consumer"], link["role"]) for link in graph(root)["links"]
            if link["status"] == "broken"]


def test_a_healthy_run_has_every_record_and_an_intact_chain(trained):
    for stage in RECORDS:
        record = json.loads((trained / RECORDS[stage]).read_text())
        assert record["stage"] == stage and record["outputs"], stage
    chain = graph(trained)
    assert chain["intact"] is True
    statuses = {(link["consumer"], link["role"]): link["status"] for link in chain["links"]}
    assert len(statuses) == sum(len(roles) for roles in CONSUMES.values())
    assert statuses[("evaluate", "val")] == statuses[("baselines", "fitted on")] == "ok"
    # the debug preset trains without soft targets: those links are shown as not used, never as verified
    assert statuses[("train", "soft targets")] == "not used"
    evaluate = json.loads((trained / RECORDS["evaluate"]).read_text())
    val = np.load(trained / "data/encoded/val.npy")
    assert evaluate["inputs"]["val"]["used"] == {"start": 0, "stop": len(val), "sha256": values_digest(val),
                                                 "kind": "ids"}
    assert evaluate["inputs"]["train slice"]["used"]["stop"] == len(val)
    assert (trained / "reports/metrics.json").is_file()


def test_evaluate_scoring_train_as_val_is_refused_by_the_report(run_copy, monkeypatch, capsys):
    """A train-val gap of exactly 0: evaluate scores the train split where it means val. It exits 0; the report
    recomputes what was scored from data/encoded/val.npy and refuses the metrics, naming the link."""
    real = checkpoint_eval.load_ids
    monkeypatch.setattr(checkpoint_eval, "load_ids", lambda folder, split: real(folder, "train" if split == "val"
                                                                                  else split))
    assert run_stage("evaluate", capsys)[0] == 0
    code, out = run_stage("report", capsys)
    assert code == 1
    assert "chain of custody broken at encode -> evaluate (val, data/encoded/val.npy): 'evaluate' used other " \
           "values as its val than data/encoded/val.npy" in out
    assert broken(run_copy) == [("encode", "evaluate", "val")]
    assert not (run_copy / "reports/metrics.json").exists(), "no decision metrics from a broken chain"
    html = (run_copy / "reports/report.html").read_text()
    assert "Chain of custody broken at 1 link(s)" in html and '<path class="edge broken"' in html
    # in a real browser: the graph is drawn, its broken link in red beside the verified ones in green
    from helpers.browser import pixels_near, visit
    from minigpt.report.custody_view import COLOURS

    seen = visit(run_copy / "reports/report.html")
    assert seen.console_errors == [] and len(seen.custody_graphs) == 1
    assert "Chain of custody broken" in seen.text
    graph = seen.custody_graphs[0]
    assert pixels_near(graph, COLOURS["broken"]) > 100 and pixels_near(graph, COLOURS["ok"]) > 300


def test_a_train_slice_taken_from_val_is_refused_by_the_report(run_copy, monkeypatch, capsys):
    real = checkpoint_eval.load_ids
    monkeypatch.setattr(checkpoint_eval, "load_ids", lambda folder, split: real(folder, "val" if split == "train"
                                                                                  else split))
    assert run_stage("evaluate", capsys)[0] == 0
    evaluation = json.loads((run_copy / "reports/evaluation.json").read_text())
    assert evaluation["generalization_gap"] == 0.0, "the planted bug: the gap the metrics would have reported"
    code, out = run_stage("report", capsys)
    assert code == 1 and "(train slice, data/encoded/train.npy)" in out
    assert broken(run_copy) == [("encode", "evaluate", "train slice")]


def test_baselines_fitted_on_train_and_val_are_refused_by_the_report(run_copy, monkeypatch, capsys):
    """The n-grams counted on train + val score val far too well (the best static baseline moves); the stage and
    evaluate exit 0, the report recomputes the characters fitted on from clean train and refuses."""
    real = baselines_module.character_ids

    def leaked(clean_dir, placeholder):
        ids, vocab, hashes = real(clean_dir, placeholder)
        return {**ids, "train": np.concatenate([ids["train"], ids["val"]])}, vocab, hashes

    healthy = json.loads((run_copy / "reports/evaluation.json").read_text())["baselines"]
    with monkeypatch.context() as planted:
        planted.setattr(baselines_module, "character_ids", leaked)
        assert run_stage("baselines", capsys)[0] == 0
    code, out = run_stage("evaluate", capsys)
    assert code == 0, out
    moved = json.loads((run_copy / "reports/evaluation.json").read_text())["baselines"]
    assert moved["vs_best_static_bpc"] > healthy["vs_best_static_bpc"] + 0.5, "the number the bug moves"
    code, out = run_stage("report", capsys)
    assert code == 1 and "clean -> baselines (fitted on, data/clean/train.txt)" in out
    assert broken(run_copy) == [("clean", "baselines", "fitted on")]


def test_an_artifact_changed_after_its_producer_ran_is_refused_by_its_consumer(run_copy, capsys):
    val = run_copy / "data/encoded/val.npy"
    ids = np.load(val)
    np.save(val, ids[::-1].copy(), allow_pickle=False)
    code, out = run_stage("evaluate", capsys)
    assert code == 1
    assert "data/encoded/val.npy: stage 'evaluate' was about to read its val, but the file is not the one stage " \
           "'encode' recorded writing" in out and "Run `dvc repro encode`" in out


def test_a_checkpoint_replaced_after_training_is_refused_by_evaluate_and_generate(run_copy, capsys):
    best, latest = run_copy / "models/mini_gpt_best.pt", run_copy / "models/mini_gpt_latest.pt"
    best.write_bytes(latest.read_bytes() + b"")  # the same layout, but not the file train recorded as best
    if best.read_bytes() == (run_copy / "models/mini_gpt_latest.pt").read_bytes():
        best.write_bytes(best.read_bytes()[:-1] + bytes([best.read_bytes()[-1] ^ 1]))
    for stage in ("evaluate", "generate"):
        code, out = run_stage(stage, capsys)
        assert code == 1 and f"stage '{stage}' was about to read its checkpoint" in out, out


def test_a_stage_run_on_a_stale_input_is_named_as_the_broken_link(run_copy, capsys):
    """The raw val text changes after training and clean, encode, baselines and evaluate rerun: each reads what
    the stage before it recorded, but the checkpoint was trained on the old val split; the report names
    encode -> train."""
    raw = run_copy / "data/raw/wiki.valid.raw"
    raw.write_bytes(raw.read_bytes()[: len(raw.read_bytes()) // 2])
    for name in ("clean", "encode", "baselines", "evaluate"):
        code, out = run_stage(name, capsys)
        assert code == 0, out
    code, out = run_stage("report", capsys)
    assert code == 1 and "chain of custody broken at encode -> train (val ids" in out
    assert ("encode", "train", "val ids") in broken(run_copy)


def test_artifacts_without_a_record_are_refused_with_the_command_that_rebuilds_them(run_copy, capsys):
    (run_copy / RECORDS["encode"]).unlink()
    code, out = run_stage("evaluate", capsys)
    assert code == 1
    assert "data/encoded/provenance.json: no provenance record of stage 'encode'; run `dvc repro encode`" in out


def test_the_report_stage_lists_every_artifact_the_chain_reads_as_a_dvc_dep():
    import yaml

    from helpers import REPO_ROOT

    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    deps = set(stages["report"]["deps"])
    for consumer, roles in CONSUMES.items():
        for role in roles.values():
            artifact = str(role.artifact)
            assert artifact in deps or any(artifact.startswith(dep + "/") for dep in deps), (consumer, artifact)
    for stage, record in RECORDS.items():
        if stage in stages:
            outs = [next(iter(o)) if isinstance(o, dict) else o for o in stages[stage]["outs"]]
            assert any(str(record) == out or str(record).startswith(out + "/") for out in outs), (stage, record)


def scoring_in_training_mode(real):
    """The scoring forward with the model switched back to training mode (a stray model.train() in a helper)."""
    def window_nll(model, inputs, targets, precision):
        model.train()
        return real(model, inputs, targets, precision)
    return window_nll


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_scoring_in_training_mode_is_refused_by_evaluate_by_name(run_copy, monkeypatch, capsys, dropout):
    """At dropout 0.1 both checks fire; at dropout 0 training mode changes no output, so only the probe of the
    modules' mode can see it (determinism passes there)."""
    import yaml

    from helpers.pipeline_fixture import recompose as compose

    source = yaml.safe_load((run_copy / "params.yaml").read_text())["data"]["path"]
    compose(run_copy, source, FAST + [f"model.dropout={dropout}"])
    for name in ("preflight", "train", "evaluate"):
        code, out = run_stage(name, capsys)
        assert code == 0, out
    healthy = json.loads((run_copy / "reports/evaluation.json").read_text())["scoring_checks"]
    assert healthy["eval_mode"]["passed"] and healthy["eval_mode"]["modules_called"] > 0
    assert healthy["deterministic"] == {"passed": True, "targets": 64, "differing": 0, "max_abs_diff": 0.0}
    monkeypatch.setattr(scoring, "window_nll", scoring_in_training_mode(scoring.window_nll))
    code, out = run_stage("evaluate", capsys)
    assert code == 1 and "scoring check(s) failed: eval_mode:" in out and "Not reporting a metric" in out
    assert "(model), " in out or "blocks." in out
    assert ("deterministic: two passes over the first 64 targets of val differ" in out) == (dropout > 0)
    assert not (run_copy / "reports/evaluation.json").exists()


# ------------------------------------------------------------------------------ resume is proven, not assumed

def forgets_the_optimizer_state(self, state):
    """load_state_dict that keeps the fresh optimizer's state (a restore that skipped it)."""


@pytest.mark.parametrize("plant,part", [
    ("rng", "RNG streams"),
    ("optimizer", "optimizer"),
])
def test_a_resume_that_restores_a_part_wrongly_fails_preflight_and_is_refused_at_resume(project, monkeypatch,
                                                                                          plant, part):
    """A restore that forgets the RNG states, or the optimizer's moments: preflight's resume check sees the
    interrupted run end elsewhere than the uninterrupted one, and the loop refuses to continue such a resume,
    naming the part, before its first step."""
    from minigpt.model.checkpoint import CheckpointError
    from minigpt.preflight.suite import run_preflight
    from minigpt.train import run_state
    from minigpt.train.loop import train
    from minigpt.train.run_control import TrainingStopped

    root, source = project
    # the average is restored (and checked) too; dropout draws from the RNG, so a forgotten RNG state matters
    params = recompose(root, source, ["train.ema_decay=0.9", "model.dropout=0.1", *FAST])
    healthy = run_preflight(params, root)
    resume = next(c for c in healthy["checks"] if c["name"] == "resume")
    assert resume["status"] == "passed" and set(resume["measured"]["parts"].values()) == {"equal"}
    assert {"trained weights", "weight average updates", "optimizer state"} <= set(resume["measured"]["parts"])
    assert "weight average" in resume["measured"]["verified"]
    if plant == "rng":
        monkeypatch.setattr(run_state, "restore_rng", lambda states: None)
    else:
        monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", forgets_the_optimizer_state)
    report = run_preflight(params, root)
    assert report["failed"] == ["resume"]
    check = next(c for c in report["checks"] if c["name"] == "resume")
    assert f"the {part} differ from what the checkpoint recorded" in check["message"]
    with pytest.raises(TrainingStopped):
        train(params, root, require_gate=False, out=lambda _m: None, stop_at_step=10)
    with pytest.raises(CheckpointError, match=f"after the resume, the {part} differ from what the checkpoint "
                                              "recorded when it was written: the restore is broken"):
        train(params, root, require_gate=False, out=lambda _m: None)


def test_the_resume_check_keeps_one_thread_count_while_other_minigpt_processes_come_and_go(project, monkeypatch,
                                                                                           tmp_path):
    """Two queue workers at once: the other worker starting or ending between the check's runs changes this
    process's share of the cores; a float reduction split over another number of threads rounds differently, so the
    check's three runs (whole, stopped, resumed) must all run on the thread count it started with."""
    import itertools

    from minigpt.core import thread_share
    from minigpt.preflight import resume_check
    from minigpt.preflight.context import Context

    root, source = project
    params = recompose(root, source, FAST)
    monkeypatch.setenv(thread_share.REGISTRY_ENV, str(tmp_path / "workers"))
    monkeypatch.delenv(thread_share.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    shares = itertools.cycle((2, 1))  # each look at the machine finds the other worker started, then ended
    monkeypatch.setattr(thread_share, "available_cores", lambda: next(shares))
    seen = []
    real_train = resume_check.train

    def train_counting_threads(*args, **kwargs):
        seen.append(torch.get_num_threads())
        try:
            return real_train(*args, **kwargs)
        finally:
            seen.append(torch.get_num_threads())

    monkeypatch.setattr(resume_check, "train", train_counting_threads)
    before = torch.get_num_threads()
    try:
        with thread_share.ThreadShare():
            measured = resume_check.check_resume(Context(params=params, root=root, device=torch.device("cpu")))
            assert len(seen) == 6 and len(set(seen)) == 1, f"threads before/after each run: {seen}"
            assert thread_share.rebalance() != seen[0], "outside the check, the share is followed again"
    finally:
        torch.set_num_threads(before)
    assert set(measured["parts"].values()) == {"equal"}


def test_docs_list_the_reference_of_every_check_and_watchdog_the_code_has():
    import re

    from helpers import REPO_ROOT
    from minigpt.evaluate.generation_checks import GENERATION_CHECKS
    from minigpt.evaluate.scoring_checks import SCORING_CHECKS
    from minigpt.preflight.suite import CHECKS
    from minigpt.train.training_checks import TRAINING_CHECKS
    from minigpt.train.watchdogs import LEVELS

    text = (REPO_ROOT / "docs/preflight.md").read_text(encoding="utf-8")
    section = text.split("\n## What each check is compared against\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \| [^|]+ \| [^|]+\|$", section, flags=re.M)
    assert len(listed) == len(set(listed)), "a check listed twice"
    expected = ({c.name for c in CHECKS} | set(LEVELS) | set(SCORING_CHECKS) | set(GENERATION_CHECKS)
                | set(TRAINING_CHECKS) | {"chain_of_custody", "resume_verified"})
    assert set(listed) == expected


# ------------------------------------------------------------------------------------ the training checklist

def test_training_records_the_guides_checklist_and_a_healthy_run_passes_it(trained):
    from minigpt.train.training_checks import TRAINING_CHECKS

    summary = json.loads((trained / "reports/train_summary.json").read_text())
    checks = summary["checks"]
    assert list(checks) == list(TRAINING_CHECKS) and all(c["passed"] for c in checks.values())
    logged = [json.loads(line) for line in (trained / "reports/train_log.jsonl").read_text().splitlines()]
    evaluations = sum("val_loss" in r for r in logged)
    assert checks["validation_eval_mode"]["evaluations"] == checks["best_follows_val"]["evaluations"] == evaluations
    assert checks["best_follows_val"]["checkpoint_step"] == summary["best_step"]
    # the run page lists every check the stages recorded, each with its result
    from minigpt.evaluate.generation_checks import GENERATION_CHECKS
    from minigpt.evaluate.scoring_checks import SCORING_CHECKS

    html = (trained / "reports/report.html").read_text()
    table = html.split('<table class="stage-checks">', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr")[2:]
    assert len(rows) == len(TRAINING_CHECKS) + len(SCORING_CHECKS) + len(GENERATION_CHECKS)
    assert all('<span class="passed">passed</span>' in row for row in rows)
    assert "<code>best_follows_val</code>" in table and "<code>context_within_block</code>" in table


def validates_in_training_mode(model, batches, precision="fp32"):
    """evaluate_model without model.eval(): dropout stays on while the validation loss is computed."""
    with torch.no_grad():
        return sum(float(batch_loss.calc_loss_batch(model, x, y, precision)) for x, y in batches) / len(batches)


def keeps_the_first_best_only(real):
    """save_checkpoints that writes the best checkpoint once, then only the latest one."""
    from minigpt.core.paths import BEST_CHECKPOINT

    saved = []

    def save_checkpoints(self, names):
        real(self, [n for n in names if n != BEST_CHECKPOINT or not saved])
        saved.extend(n for n in names if n == BEST_CHECKPOINT)
    return save_checkpoints


@pytest.mark.parametrize("plant,name", [("train_mode", "validation_eval_mode"), ("stale_best", "best_follows_val")])
def test_a_loop_that_breaks_the_training_checklist_fails_by_name(project, monkeypatch, plant, name):
    """Validation computed with dropout on, or a best checkpoint that stops following the val loss: the training
    loop itself refuses to finish, naming the checklist item (evaluate and generate never see such a run)."""
    from minigpt.train import run_state
    from minigpt.train.loop import train
    from minigpt.train.training_checks import TrainingCheckFailed

    root, source = project
    params = recompose(root, source, ["model.dropout=0.1", *FAST])
    if plant == "train_mode":
        monkeypatch.setattr(batch_loss, "evaluate_model", validates_in_training_mode)
    else:
        first_best_only = keeps_the_first_best_only(run_state.Run.save_checkpoints)
        monkeypatch.setattr(run_state.Run, "save_checkpoints", first_best_only)
    with pytest.raises(TrainingCheckFailed, match=f"^{name}: "):
        train(params, root, require_gate=False, out=lambda _m: None)
    assert not (root / "reports/train_summary.json").exists()


# ------------------------------------------------------------------------------------ the generation checklist

def test_generation_records_the_guides_checklist_and_a_healthy_run_passes_it(trained):
    from minigpt.evaluate.generation_checks import GENERATION_CHECKS

    checks = json.loads((trained / "reports/generation.json").read_text())["checks"]
    assert list(checks) == list(GENERATION_CHECKS) and all(c["passed"] for c in checks.values())
    assert checks["context_within_block"]["most_positions"] == checks["context_within_block"]["block_size"], \
        "40 new characters fill the 32-token window: the crop was exercised"


@pytest.mark.parametrize("plant,name", [("train_mode", "eval_mode"), ("uncropped", "context_within_block")])
def test_a_sampler_that_breaks_the_checklist_is_refused_by_generate_by_name(run_copy, monkeypatch, capsys, plant,
                                                                           name):
    from minigpt.model.gpt import MiniGPT

    real = MiniGPT._prefill

    def planted(self, context):
        if plant == "train_mode":  # a helper that leaves dropout on
            self.train()
            return real(self, context)
        return real(self, torch.cat([context] * 3, dim=1))  # a context grown past the window

    monkeypatch.setattr(MiniGPT, "_prefill", planted)
    code, out = run_stage("generate", capsys)
    assert code == 1 and name in out, out
    assert "Traceback" not in out
    assert not (run_copy / "reports/generation.json").exists()
