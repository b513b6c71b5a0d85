"""The data stages through real `dvc repro` on the fixture, in a temporary git repo."""

import json
import subprocess
import sys

import pytest

from helpers.browser import coloured_pixels, visit
from helpers.dvc_project import DvcProject

# real `dvc repro` / `dvc exp run` in throwaway git repos: minutes in all, so in the slow tier (CI runs it)
pytestmark = pytest.mark.slow


def test_dvc_repro_encode_then_noop_then_clean_option_reruns_only_downstream(tmp_path, fixture_dir):
    project = DvcProject(tmp_path / "proj", ["data=local", f"data.path={fixture_dir}"])
    first = project.dvc("repro", "encode")
    assert project.stages_run(first.stdout) == ["fetch", "clean", "tokenizer", "encode"]
    root = project.root
    for artifact in ["data/raw/manifest.json", "data/clean/train.txt", "data/clean/val.txt", "data/clean/test.txt",
                     "data/tokenizer/tokenizer.json", "data/encoded/meta.json", "data/encoded/train.npy",
                     "reports/clean.json"]:
        assert (root / artifact).is_file(), artifact
    report = json.loads((root / "reports/clean.json").read_text())
    assert report["splits"]["val"]["replaced"] > 0

    second = project.dvc("repro", "encode")
    assert project.stages_run(second.stdout) == []

    project.compose(["data=local", f"data.path={fixture_dir}", "clean.detokenize_markup=true"])
    third = project.dvc("repro", "encode")
    assert project.stages_run(third.stdout) == ["clean", "tokenizer", "encode"]
    assert "@-@" not in (root / "data/clean/train.txt").read_text()


def test_failing_fetch_stops_dvc_and_leaves_no_valid_looking_data(tmp_path):
    project = DvcProject(tmp_path / "proj", ["data=local", f"data.path={tmp_path / 'absent'}"])
    result = project.dvc("repro", "encode", check=False)
    assert result.returncode != 0
    assert "does not exist" in result.stderr + result.stdout
    assert not (project.root / "data" / "raw").exists()
    assert not (project.root / "data" / "clean").exists()


def test_preflight_gates_each_learning_rate_and_stops_dvc_on_failure(tmp_path, fixture_dir):
    base = ["experiment=debug", "data=local", f"data.path={fixture_dir}"]
    project = DvcProject(tmp_path / "proj", base)
    first = project.dvc("repro", "preflight")
    assert project.stages_run(first.stdout) == ["fetch", "clean", "tokenizer", "encode", "soft_targets",
                                                    "preflight"], "no baselines"
    report = json.loads((project.root / "reports/debug_report.json").read_text())
    assert report["passed"] is True

    # an LR change reruns preflight alone: every LR of a sweep gets its own gate
    project.compose(base + ["train.lr=0.001"])
    second = project.dvc("repro", "preflight")
    assert project.stages_run(second.stdout) == ["preflight"]

    project.compose(base + ["train.lr=1.0"])
    failed = project.dvc("repro", "preflight", check=False)
    assert failed.returncode != 0
    assert "lr_stability" in failed.stdout + failed.stderr
    report = json.loads((project.root / "reports/debug_report.json").read_text())
    assert report["passed"] is False and report["failed"] == ["lr_stability"]


ALL_STAGES = ["fetch", "clean", "tokenizer", "encode", "soft_targets", "baselines", "preflight", "train", "evaluate",
              "generate", "report"]
LR_STAGES = ["preflight", "train", "evaluate", "generate", "report"]


def test_full_dag_then_noop_then_lr_sweep_through_the_queue(tmp_path, fixture_dir):
    base = ["experiment=debug", "data=local", f"data.path={fixture_dir}", "generate.max_new_tokens=60"]
    project = DvcProject(tmp_path / "proj", base)
    first = project.dvc("repro")
    assert project.stages_run(first.stdout) == ALL_STAGES
    root = project.root
    for artifact in ["data/raw/manifest.json", "data/encoded/meta.json", "reports/clean.json",
                     "reports/debug_report.json",
                     "models/mini_gpt_latest.pt", "models/mini_gpt_best.pt", "reports/train_log.jsonl",
                     "reports/train_curves.png", "reports/train_summary.json", "reports/plots/train.csv",
                     "reports/evaluation.json", "reports/samples.md", "reports/generation.json", "reports/metrics.json",
                     "reports/report.html"]:
        assert (root / artifact).is_file(), artifact
    evaluation = json.loads((root / "reports/evaluation.json").read_text())
    assert evaluation["val"]["bpc"] < evaluation["baseline_bpc"]
    shown_metrics = json.loads(project.dvc("metrics", "show", "--json").stdout)
    files = {path for rev in shown_metrics.values() for path in rev.get("data", {})}
    assert files == {"reports/metrics.json"}, "DVC compares the decision metrics only"
    assert json.loads((root / "reports/debug_report.json").read_text())["passed"] is True
    assert project.stages_run(project.dvc("repro").stdout) == []

    # a code change after a finished run: the old report is refused by name, and the rerun trains from step 1
    model_py = root / "minigpt/model/gpt.py"
    model_py.write_text(model_py.read_text() + "\n# a code change\n")
    refused = project.run(sys.executable, "stages/train.py", check=False)
    assert refused.returncode == 1 and "mismatched fingerprint: code (minigpt/model/gpt.py)" in refused.stderr
    assert "Traceback" not in refused.stderr
    rerun = project.dvc("repro")
    assert project.stages_run(rerun.stdout) == LR_STAGES
    assert "not resuming" in rerun.stdout and "other code (changed: minigpt/model/gpt.py)" in rerun.stdout
    assert "steps 1..200" in rerun.stdout and "resuming from" not in rerun.stdout

    project.git("add", "-A")
    project.git("commit", "-q", "-m", "baseline run")
    # `dvc exp run` recomposes params.yaml from conf/: the baseline's own overrides go along with the sweep
    overrides = [arg for o in base for arg in ("-S", o)]
    # lr 1.0: the gate refuses it, the experiment fails at preflight, and the comparison page says why
    project.dvc("exp", "run", *overrides, "-S", "train.lr=0.001,0.002,1.0", "--queue")
    swept = project.dvc("exp", "run", "--run-all", "-j", "1", check=False)
    ran = project.stages_run(swept.stdout)
    assert sorted(ran) == sorted(LR_STAGES * 2 + ["preflight"]), swept.stdout
    assert "Stage 'encode' didn't change, skipping" in swept.stdout
    assert "Stage 'baselines' didn't change, skipping" in swept.stdout, "an LR sweep never refits the baselines"

    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    experiments = [run for rev in shown for e in (rev.get("experiments") or []) for run in e["revs"] if run.get("name")]
    names = [run["name"] for run in experiments if not run.get("error")]
    refused = [run["name"] for run in experiments if run.get("error")]
    assert len(names) == 2 and len(refused) == 1, shown
    diff = json.loads(project.dvc("metrics", "diff", names[0], names[1], "--json").stdout)
    bpc = diff["reports/metrics.json"]["val_bpc"]
    assert bpc["old"] != bpc["new"]
    table = project.dvc("metrics", "diff", names[0], names[1], "--all").stdout.strip().splitlines()
    assert len(table) <= 15, "one screen: " + "\n".join(table)
    csv_header = project.dvc("exp", "show", "--csv").stdout.splitlines()[0].split(",")
    assert {"val_bpc", "test_bpc", "vs_base", "train.lr"} <= set(csv_header), csv_header
    # the table DVC draws on a terminal (rich sizes it from COLUMNS): the swept param must end within 120 columns
    wide = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--no-pager"], cwd=root, capture_output=True,
                          text=True, env={**project.env, "COLUMNS": "400"}).stdout.splitlines()
    header = next(line for line in wide if "Experiment" in line)
    assert header.index("train.lr") + len("train.lr") <= 120, header
    assert header.index("val_bpc") < header.index("train.lr"), header
    assert header.index("vs_base") < header.index("train.lr"), "the baseline margin is visible beside val_bpc"
    compared = project.run(sys.executable, "-m", "minigpt.report", "compare", *names, *refused, "--out", "compare.html")
    assert compared.returncode == 0, compared.stderr
    seen = visit(root / "compare.html")
    assert seen.console_errors == [] and seen.requests == [(root / "compare.html").resolve().as_uri()]
    assert all(name in seen.text for name in names + refused) and "train.lr" in seen.text
    assert any(coloured_pixels(png) > 300 for png in seen.chart_screenshots)
    assert any(row.startswith("lr_stability") and "too high" in row for row in seen.failed_rows), seen.failed_rows

    # share the baseline through a DVC remote: a second clone pulls it and has nothing to rerun
    project.dvc("remote", "add", "-d", "storage", str(tmp_path / "remote"))
    project.dvc("push")
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "results and remote")
    project.run("git", "clone", "-q", str(root), str(tmp_path / "second"))
    second = DvcProject.attach(tmp_path / "second", project.env)
    second.dvc("pull")
    assert (second.root / "models/mini_gpt_best.pt").read_bytes() == (root / "models/mini_gpt_best.pt").read_bytes()
    status = second.dvc("status")
    assert "Data and pipelines are up to date" in status.stdout, status.stdout


def test_a_failing_preflight_stops_dvc_repro_before_train(tmp_path, fixture_dir):
    project = DvcProject(tmp_path / "proj",
                         ["experiment=debug", "data=local", f"data.path={fixture_dir}", "train.lr=1.0"])
    result = project.dvc("repro", check=False)
    assert result.returncode != 0
    assert project.stages_run(result.stdout) == ["fetch", "clean", "tokenizer", "encode", "soft_targets", "baselines",
                                                 "preflight"]
    assert "lr_stability" in result.stdout
    assert not (project.root / "models").exists() or not list((project.root / "models").iterdir())
    assert json.loads((project.root / "reports/debug_report.json").read_text())["passed"] is False


def test_a_damaged_dvc_cache_copy_of_an_encoded_split_is_named_by_preflight_with_the_fix(tmp_path, fixture_dir):
    """DVC trusts its cache: a checkout copies an object whose bytes changed without reading it again. Preflight's
    files check notices the split, names the damaged object and the fix, and the fix works."""
    import hashlib

    project = DvcProject(tmp_path / "proj", ["experiment=debug", "data=local", f"data.path={fixture_dir}"])
    root = project.root
    project.dvc("repro", "encode")
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "encoded")
    train_file = root / "data/encoded/train.npy"
    recorded = hashlib.md5(train_file.read_bytes()).hexdigest()
    cached = root / ".dvc/cache/files/md5" / recorded[:2] / recorded[2:]
    damaged = bytearray(cached.read_bytes())
    damaged[-100:-90] = bytes((b + 1) % 40 for b in damaged[-100:-90])  # other valid IDs: the text changes
    cached.chmod(0o644)
    cached.write_bytes(bytes(damaged))
    train_file.unlink()
    project.dvc("checkout", "data/encoded")
    assert train_file.read_bytes() == bytes(damaged), "DVC copied the damaged object without noticing"

    refused = project.run(sys.executable, "stages/preflight.py", check=False)
    assert refused.returncode == 1
    row = next(line for line in refused.stdout.splitlines() if line.startswith("files "))
    assert "FAILED" in row and f"damaged DVC cache copy (its bytes no longer have the MD5 it is stored under): " \
                                f"{cached}. Delete it, then run `dvc repro --force --single-item encode`" in row, row

    cached.unlink()
    project.dvc("repro", "--force", "--single-item", "encode")
    assert hashlib.md5(cached.read_bytes()).hexdigest() == recorded, "DVC stored a sound copy"
    passed = project.run(sys.executable, "stages/preflight.py")
    assert next(line for line in passed.stdout.splitlines() if line.startswith("files ")).split()[1] == "PASSED"


def test_two_queue_workers_at_once_each_train_their_own_run_on_their_share_of_the_cores(tmp_path, fixture_dir):
    """`dvc exp run --run-all -j 2` of a 4-point sweep: every experiment trains from step 1 on its own checkpoint,
    lock and report, and while two run at once each takes its share of the cores (README: cores / running minigpt
    processes)."""
    import os

    base = ["experiment=debug", "data=local", f"data.path={fixture_dir}", "generate.max_new_tokens=40"]
    project = DvcProject(tmp_path / "proj", base)
    project.dvc("repro", "soft_targets", "baselines")  # the data stages once, in the workspace, as a user would
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "data")
    overrides = [arg for o in base for arg in ("-S", o)]
    lrs = ("0.001", "0.002", "0.003", "0.004")
    project.dvc("exp", "run", *overrides, "-S", f"train.lr={','.join(lrs)}", "--queue")
    swept = project.dvc("exp", "run", "--run-all", "-j", "2", check=False)
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    assert "another trainer is running" not in swept.stdout + swept.stderr
    # no data stage reruns; the combined output of two workers can lack one worker's stage lines, so what each
    # experiment trained is read from its own files below
    ran = project.stages_run(swept.stdout)
    assert ran and set(ran) <= set(LR_STAGES), swept.stdout[-6000:]

    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    experiments = [run for rev in shown for e in (rev.get("experiments") or []) for run in e["revs"] if run.get("name")]
    failed = [run["name"] for run in experiments if run.get("error")]
    logs = [project.dvc("queue", "logs", name, check=False) for name in failed]
    assert len(experiments) == 4 and not failed, "\n".join(f"{name}:\n{log.stdout[-4000:]}{log.stderr[-2000:]}"
                                                          for name, log in zip(failed, logs)) or shown
    summaries = {}
    def read(path: str, rev: str) -> dict:
        return json.loads(project.run(sys.executable, "-c", "import sys, dvc.api; sys.stdout.write(dvc.api.read("
                                      f"{path!r}, rev={rev!r}))").stdout)

    for run in experiments:
        lr = str(read("reports/debug_report.json", run["name"])["config"]["train"]["lr"])
        summary = read("reports/train_summary.json", run["name"])
        assert summary["resumed_from_step"] is None and summary["steps"] == 200, "trained from step 1, alone"
        summaries[lr] = summary
    assert sorted(summaries) == sorted(str(float(lr)) for lr in lrs), "each experiment has its own gate report"
    assert len({s["best_val_loss"] for s in summaries.values()}) == 4, "four different runs, none another's copy"
    cores = len(os.sched_getaffinity(0))
    threads = sorted({t for s in summaries.values() for t in s["threads"]})
    assert max(threads) <= cores, threads
    if cores >= 2:
        assert any(max(1, cores // 2) in s["threads"] for s in summaries.values()), summaries


VERDICTS = ("B is better", "B is worse", "no detectable difference")


def test_a_bpe_run_through_dvc_next_to_a_char_run_on_the_comparison_page(tmp_path, fixture_dir):
    """`-S tokenizer=bpe` as an experiment beside the char baseline: tokenizer, encode, preflight … report rerun, the
    baselines do not (they score characters), both runs have a val bpc in `dvc exp show`, and the comparison page
    sets them side by side, paired over the same character blocks of the clean text (a B - A interval and a
    verdict, not a refusal)."""
    base = ["experiment=debug", "data=local", f"data.path={fixture_dir}", "generate.max_new_tokens=40"]
    project = DvcProject(tmp_path / "proj", base)
    project.dvc("repro")
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "char baseline")
    char_rev = project.git("rev-parse", "HEAD").stdout.strip()
    overrides = [arg for o in base for arg in ("-S", o)]
    bpe = project.dvc("exp", "run", *overrides, "-S", "tokenizer=bpe", "-S", "tokenizer.vocab_size=300", "-n", "bpe")
    assert project.stages_run(bpe.stdout) == ["tokenizer", "encode", "soft_targets", *LR_STAGES], bpe.stdout
    assert "Stage 'baselines' didn't change, skipping" in bpe.stdout
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    rows = [run for rev in shown for run in [rev, *[r for e in (rev.get("experiments") or []) for r in e["revs"]]]]
    bpcs = [run.get("data", {}).get("metrics", {}).get("reports/metrics.json", {}).get("data", {}).get("val_bpc")
            for run in rows]
    assert len([b for b in bpcs if b is not None]) >= 2, shown
    compared = project.run(sys.executable, "-m", "minigpt.report", "compare", char_rev, "bpe", "--out", "compare.html")
    page = (project.root / "compare.html").read_text()
    assert compared.returncode == 0 and "tokenizer.kind" in page and "different tokenizers" not in page, page[-4000:]
    # the page says each run against the best one ("is worse", "is better", "no detectable difference")
    assert any(verdict.replace("B is", "is") in page for verdict in VERDICTS), page[-4000:]
    diffed = project.run(sys.executable, "-m", "minigpt.report", "diff", char_rev, "bpe").stdout
    assert "tokenizer.kind" in diffed and sum(verdict in line for line in diffed.splitlines()
                                              for verdict in VERDICTS) == 2, diffed


def test_a_queued_lr_sweep_under_a_budget_preset_trains_each_lr_and_shows_what_trained(tmp_path, fixture_dir):
    """params.yaml is the run: with the machine's choice measured (`make machine`) and composed, each queued LR of a
    budget preset is the LR the run applies, and `dvc exp show` lists the shape and precision that trained."""
    from helpers.machines import TINY_SMALL

    base = ["experiment=budget-72s", "data=local", f"data.path={fixture_dir}", "generate.max_new_tokens=60",
            "evaluate.dynamic=false", "evaluate.mixture_order=0"]
    project = DvcProject(tmp_path / "proj", ["experiment=debug", "data=local", f"data.path={fixture_dir}"])
    root = project.root
    # the budget preset at fixture scale: the small shape tiny, 8 s of clock
    (root / "conf/shape/small.yaml").write_text(TINY_SMALL)
    preset = root / "conf/experiment/budget-72s.yaml"
    preset.write_text(preset.read_text().replace("max_seconds: 72", "max_seconds: 8"))
    unmeasured = project.dvc("exp", "run", *[a for o in base for a in ("-S", o)], check=False)
    assert unmeasured.returncode != 0
    assert "conf/machine/budget-72s.yaml: no choice has been measured on this machine yet; run `make machine`" in (
        unmeasured.stdout + unmeasured.stderr)
    measured = project.run(sys.executable, "-m", "minigpt.train.machine_command")
    assert "budget-72s measured" in measured.stdout, measured.stdout
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "the budget preset at fixture scale, measured on this machine")

    project.dvc("exp", "run", *[a for o in base for a in ("-S", o)], "-S", "train.lr=0.01,0.02", "--queue")
    swept = project.dvc("exp", "run", "--run-all", "-j", "1", check=False)
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    runs = [run for rev in shown for e in (rev.get("experiments") or []) for run in e["revs"] if run.get("name")]
    assert len(runs) == 2 and not any(run.get("error") for run in runs), swept.stdout + swept.stderr
    applied = {}
    for run in runs:
        params = run["data"]["params"]["params.yaml"]["data"]
        assert params["shape"] == "small" and params["machine"]["shape"] == "small"
        assert params["model"]["embedding_dim"] == 32 and params["train"]["precision"] == "fp32"
        log = project.git("show", f"{run['rev']}:reports/train_log.jsonl").stdout.splitlines()
        applied[params["train"]["lr"]] = max(json.loads(line).get("lr", 0) for line in log)
    assert sorted(applied) == [0.01, 0.02]
    assert all(peak == pytest.approx(lr, rel=0.05) for lr, peak in applied.items()), applied
