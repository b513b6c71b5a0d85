"""The data stages through real `dvc repro` on the fixture, in a temporary git repo."""

import json

from dvc_project import DvcProject


def test_dvc_repro_encode_then_noop_then_clean_option_reruns_only_downstream(tmp_path, fixture_dir):
    project = DvcProject(tmp_path / "proj", ["data=local", f"data.path={fixture_dir}"])
    first = project.dvc("repro", "encode")
    assert project.stages_run(first.stdout) == ["fetch", "clean", "tokenizer", "encode"]
    root = project.root
    for artifact in ["data/raw/manifest.json", "data/clean/train.txt", "data/clean/val.txt", "data/clean/test.txt",
                     "data/tokenizer/char_tokenizer.json", "data/encoded/meta.json", "data/encoded/train.npy",
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
    assert project.stages_run(first.stdout) == ["fetch", "clean", "tokenizer", "encode", "preflight"]
    report = json.loads((project.root / "reports/debug_report.json").read_text())
    assert report["passed"] is True

    # an LR change reruns preflight alone: every LR of a sweep gets its own gate
    project.compose(base + ["train.lr=0.001"])
    second = project.dvc("repro", "preflight")
    assert project.stages_run(second.stdout) == ["preflight"]

    project.compose(base + ["train.lr=0.1"])
    failed = project.dvc("repro", "preflight", check=False)
    assert failed.returncode != 0
    assert "lr_stability" in failed.stdout + failed.stderr
    report = json.loads((project.root / "reports/debug_report.json").read_text())
    assert report["passed"] is False and report["failed"] == ["lr_stability"]
