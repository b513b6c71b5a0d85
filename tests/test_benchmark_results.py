"""Every committed benchmark result names the machine it was measured on, so figures of two machines are never
mixed (a CPU model, or a GPU device, in the file itself)."""

import json
import re
import shutil
import subprocess
import sys

from helpers import REPO_ROOT


def machine_of(result: dict) -> str | None:
    label = result.get("machine") if isinstance(result.get("machine"), dict) else result
    return label.get("cpu") or label.get("device")


def test_every_committed_result_names_its_machine():
    listed = subprocess.run(["git", "ls-files", "benchmarks/*.json"], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    files = [REPO_ROOT / name for name in listed]
    assert files
    unlabelled = [str(f.relative_to(REPO_ROOT)) for f in files if not machine_of(json.loads(f.read_text()))]
    assert unlabelled == []


def test_a_result_without_a_machine_is_seen():
    assert machine_of({"machine": {"platform": "Linux", "threads": 2}}) is None
    assert machine_of({"runs": []}) is None
    assert machine_of({"machine": {"cpu": "AMD EPYC"}}) == "AMD EPYC"


# ---------------------------------------------------------------------------- generated tables and manifests

MANIFEST_FIELDS = {"command", "commit", "date", "machine"}


def tables(*args: str, root=REPO_ROOT) -> subprocess.CompletedProcess:
    """benchmarks/tables.py as `make results` / `make results-check` run it (tests never import benchmarks/)."""
    return subprocess.run([sys.executable, "-m", "benchmarks.tables", "--root", str(root), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def copy_documents(tmp_path):
    shutil.copy(REPO_ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copytree(REPO_ROOT / "benchmarks/results", tmp_path / "benchmarks/results")
    shutil.copytree(REPO_ROOT / "conf/experiment", tmp_path / "conf/experiment")
    shutil.copytree(REPO_ROOT / "conf/evaluate", tmp_path / "conf/evaluate")
    return tmp_path


def test_every_generated_table_matches_its_results_files():
    checked = tables("--check")
    assert checked.returncode == 0, checked.stderr
    assert "<!-- generated: quality -->" in (REPO_ROOT / "README.md").read_text()


def test_a_hand_edited_generated_table_fails_the_check_and_make_results_restores_it(tmp_path):
    root = copy_documents(tmp_path)
    readme = root / "README.md"
    original = readme.read_text()
    block = original[original.index("<!-- generated: quality -->"):original.index("<!-- end generated -->")]
    figure = re.search(r"\*\*\d\.\d{3}\*\*", block).group()
    edited = block.replace(figure, "**9.999**", 1)
    assert edited != block
    readme.write_text(original.replace(block, edited))
    checked = tables("--check", root=root)
    assert checked.returncode == 1
    assert "README.md: table 'quality' differs from benchmarks/results (run `make results`)" in checked.stderr
    assert tables(root=root).returncode == 0 and readme.read_text() == original


def test_a_preset_figure_trained_before_the_presets_model_settings_is_marked(tmp_path):
    root = copy_documents(tmp_path)
    preset = root / "conf/experiment/budget-15m.yaml"
    preset.write_text(preset.read_text() + "model:\n  num_layers: 99\n")
    assert tables(root=root).returncode == 0
    readme = (root / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `budget-15m` / without soft targets"))
    cells = [cell.split(" / ") for cell in row.strip(" |").split(" | ")[1:]]
    assert cells and all(preset.endswith("†") and (no_soft.endswith("†") or no_soft == "–")
                         and not nanogpt.endswith("†") for preset, no_soft, nanogpt in cells), \
        "the preset and its no-soft-target run, per machine class; not nanoGPT's recipe"
    assert "†: an older version of the preset trained it." in readme
    mixed = [line for line in (root / "docs/evaluation.md").read_text().splitlines()
             if line.startswith("| `experiment=budget-15m`")]
    assert mixed and all(line.startswith("| `experiment=budget-15m`† (") for line in mixed), mixed


def test_the_seed_spread_takes_seeded_preset_runs_and_the_mixture_the_ngrams_weight(tmp_path):
    root = copy_documents(tmp_path)
    machine = {"cpu": "Planted CPU", "cpu_family_model": "1/2", "isa": ["avx2"], "cores": 2, "torch": "x"}
    manifest = {"command": "planted", "commit": "0123456789abcdef", "date": "2026-01-01", "machine": machine}
    model = yaml_sections(root, "budget-72s")["model"]

    def run(name, *overrides, val=2.0, test=1.9):
        return {"name": name, "overrides": ["experiment=budget-72s", *overrides], "val_bpc": val, "test_bpc": test,
                "model": model}

    runs = [run("budget-72s, seed 1", "train.seed=1", val=2.30), run("budget-72s, seed 2", "train.seed=2", val=2.40),
            run("budget-72s, lr, seed 3", "train.seed=3", "train.lr=0.1", val=9.0), run("budget-72s preset", val=8.0),
            {"name": "budget-72s, seed 4", "overrides": ["experiment=budget-72s", "train.seed=4"],
             "preflight_failed": ["lr_stability"]},
            run("budget-72s, seed 5", "train.seed=5", "evaluate.dynamic=true", val=2.35),
            run("budget-72s, seed 6", "train.seed=6", "evaluate.precision=bf16", val=5.0)]
    runs[3].update(best_step=1234, mixture_val_bpc=7.5, mixture_test_bpc=7.4, mixture_weight=0.3)  # w: the model's
    # a dynamic figure adds to what trained (the run counts); another evaluate precision changes val (it does not)
    runs[5].update(dynamic_val_bpc=2.1, dynamic_evaluation={"lr": 0.0001, "streams": 1})
    (root / "benchmarks/results/quality_budget/planted-2c.json").write_text(
        json.dumps({"manifest": manifest, "machine": machine, "runs": runs}))
    assert tables(root=root).returncode == 0
    rows = [line for line in (root / "docs/evaluation.md").read_text().splitlines()
            if "`quality_budget/planted-2c`" in line]
    assert rows == ["| budget-72s | Planted CPU 1/2 (`quality_budget/planted-2c`) | `0123456789` | 3 | 2.350 ± 0.050 "
                    "(2.300 – 2.400) | 1.900 | 2.100 (1 of 3) | +0.054 … +0.154 |"], rows
    mixed = [line for line in (root / "docs/evaluation.md").read_text().splitlines() if "`planted-2c`" in line]
    assert mixed == ["| `experiment=budget-72s` (best step 1,234; `planted-2c`) | 8.000 (1.900) | 2.246 (2.088) | "
                     "7.500 (7.400) | 0.70 |"], mixed


def test_a_run_that_trained_other_preset_train_settings_is_marked_unless_it_chose_them(tmp_path):
    root = copy_documents(tmp_path)
    machine = {"cpu": "Planted CPU", "cpu_family_model": "1/2", "isa": ["avx2"], "cores": 2, "torch": "x"}
    manifest = {"command": "planted", "commit": "0123456789abcdef", "date": "2026-01-01", "machine": machine}
    preset = yaml_sections(root, "budget-72s")
    older_alpha = {**preset["train"], "distill_alpha": preset["train"]["distill_alpha"] + 0.1}

    def run(name, train, *overrides, model=preset["model"]):
        return {"name": name, "overrides": ["experiment=budget-72s", *overrides], "val_bpc": 2.0, "test_bpc": 1.9,
                "model": model, "train": train}

    # the run without the n-gram sets train and model keys of the preset's to other values, by its own overrides
    without = {**preset["train"], "distill_alpha": preset["train"]["distill_alpha"] + 0.2}
    runs = [run("budget-72s preset", older_alpha),
            run("budget-72s, no soft targets", without, f"+train.distill_alpha={without['distill_alpha']}",
                "model.ngram_expert=false", model={**preset["model"], "ngram_expert": False}),
            run("budget-72s, seed 1", older_alpha, "train.seed=1"), run("budget-72s, seed 2", preset["train"],
                                                                     "train.seed=2")]
    runs[0].update(best_step=10, mixture_val_bpc=1.5, mixture_test_bpc=1.4, mixture_weight=0.5)
    (root / "benchmarks/results/quality_budget/planted-2c.json").write_text(
        json.dumps({"manifest": manifest, "machine": machine, "runs": runs}))
    assert tables(root=root).returncode == 0
    row = next(line for line in (root / "README.md").read_text().splitlines() if line.startswith("| `budget-72s` /"))
    assert row.endswith("| **2.000**† / 2.000 / – |"), row
    evaluation = (root / "docs/evaluation.md").read_text().splitlines()
    assert [line.split(" |")[0] for line in evaluation if "planted-2c`" in line] == [
        "| `experiment=budget-72s`† (best step 10; `planted-2c`)", "| budget-72s†"], "mixture row, then seed spread"


def test_other_soft_target_settings_mark_a_preset_run_but_not_a_run_that_built_no_soft_targets(tmp_path):
    root = copy_documents(tmp_path)
    machine = {"cpu": "Planted CPU", "cpu_family_model": "1/2", "isa": ["avx2"], "cores": 2, "torch": "x"}
    manifest = {"command": "planted", "commit": "0123456789abcdef", "date": "2026-01-01", "machine": machine}
    preset = yaml_sections(root, "budget-72s")
    older = {**preset["soft_targets"], "top": preset["soft_targets"].get("top", 16) + 1}

    def run(name, soft_targets, *overrides, model=preset["model"]):
        return {"name": name, "overrides": ["experiment=budget-72s", *overrides], "val_bpc": 2.0, "test_bpc": 1.9,
                "model": model, "train": preset["train"], "soft_targets": soft_targets}

    runs = [run("budget-72s preset", older),
            run("budget-72s, no soft targets", {**older, "order": 0}, "train.distill_alpha=0", "soft_targets.order=0",
                "model.ngram_expert=false", model={**preset["model"], "ngram_expert": False})]
    (root / "benchmarks/results/quality_budget/planted-2c.json").write_text(
        json.dumps({"manifest": manifest, "machine": machine, "runs": runs}))
    assert tables(root=root).returncode == 0
    row = next(line for line in (root / "README.md").read_text().splitlines() if line.startswith("| `budget-72s` /"))
    assert row.endswith("| **2.000**† / 2.000 / – |"), row


def test_a_dynamic_figure_evaluated_with_other_settings_than_evaluates_defaults_now_is_marked(tmp_path):
    import yaml

    root = copy_documents(tmp_path)
    defaults = yaml.safe_load((root / "conf/evaluate/default.yaml").read_text())
    current = {"lr": defaults["dynamic_lr"], "streams": defaults["dynamic_streams"]}
    machine = {"cpu": "Planted CPU", "cpu_family_model": "1/2", "isa": ["avx2"], "cores": 2, "torch": "x"}
    for name, settings in (("planted-2c", current), ("planted-4c", {**current, "streams": 99}), ("planted-8c", None)):
        run = {"name": "budget-15m preset", "overrides": ["experiment=budget-15m"], "val_bpc": 2.0, "test_bpc": 1.9,
               "dynamic_val_bpc": 1.5, "dynamic_evaluation": settings, "model": yaml_sections(root, "budget-15m")
               .get("model", {})}
        manifest = {"command": "planted", "commit": "0123456789abcdef", "date": "2026-01-01", "machine": machine}
        (root / f"benchmarks/results/quality_budget/{name}.json").write_text(
            json.dumps({"manifest": manifest, "machine": machine, "runs": [run]}))
    assert tables(root=root).returncode == 0
    readme = (root / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `budget-15m`, dynamic evaluation"))
    assert row.endswith("| 1.500 | 1.500‡ | 1.500‡ |"), "planted-2c: today's settings; 4c: 99 streams; 8c: none"
    note = " ".join(readme[readme.index("‡: evaluated"):].split())
    assert note.startswith("‡: evaluated with other settings than `conf/evaluate/default.yaml` sets now (lr "), note
    listed = note.split("sets now (", 1)[1].split(")", 1)[0].split("; ")
    assert {"streams 99", "lr not recorded, streams not recorded"} <= set(listed), listed
    assert not any("lr 0.0001" in item for item in listed), "only the settings that differ from today's"


def test_the_dynamic_settings_table_bolds_the_shipped_setting_only(tmp_path):
    import yaml

    root = copy_documents(tmp_path)
    defaults = yaml.safe_load((root / "conf/evaluate/default.yaml").read_text())
    machine = {"cpu": "Planted CPU", "cpu_family_model": "1/2", "isa": ["avx2"], "cores": 2, "torch": "x"}
    manifest = {"command": "planted", "commit": "0123456789abcdef", "date": "2026-01-01", "machine": machine}

    def row(lr, streams, val):
        return {"lr": lr, "streams": streams, "val": {"bpc": val, "steps": 1000, "seconds": 12.4},
                "test": {"bpc": val - 0.1, "steps": 1100, "seconds": 13.0}}

    rows = [row(defaults["dynamic_lr"], defaults["dynamic_streams"], 1.5), row(3e-4, 7, 1.6)]
    folder = root / "benchmarks/results/dynamic_settings"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "planted-2c.json").write_text(json.dumps({"manifest": manifest, "machine": machine, "rows": rows,
                                                        "checkpoint": {"label": "planted run", "best_step": None}}))
    assert tables(root=root).returncode == 0
    lines = [line for line in (root / "docs/evaluation.md").read_text().splitlines() if "`planted-2c`" in line]
    assert lines == [f"| planted run, best step – (`planted-2c`) | {defaults['dynamic_lr']:g} | "
                     f"{defaults['dynamic_streams']} | **1.500** | 1.400 | 1,000 | 12 |",
                     "| planted run, best step – (`planted-2c`) | 0.0003 | 7 | 1.600 | 1.500 | 1,000 | 12 |"], lines


def yaml_sections(root, preset: str) -> dict:
    """The sections a preset sets, as a run of it records them (tests never import benchmarks/)."""
    import yaml

    return yaml.safe_load((root / "conf/experiment" / f"{preset}.yaml").read_text())




def test_a_typed_table_with_three_decimal_figures_outside_the_markers_fails_the_check(tmp_path):
    root = copy_documents(tmp_path)
    readme = root / "README.md"
    lines = readme.read_text().splitlines()
    at = lines.index("## Troubleshooting")
    lines[at:at] = ["| run | val bpc |", "| --- | --- |", "| mine | 2.101 |", ""]
    readme.write_text("\n".join(lines) + "\n")
    checked = tables("--check", root=root)
    assert checked.returncode == 1
    assert f"README.md:{at + 3}: a table row with a three-decimal figure outside a generated block" in checked.stderr


def test_every_result_is_in_its_benchmark_folder_with_its_manifest():
    """benchmarks/results/<benchmark>/<machine class>.json, each with the manifest that says where it came from."""
    results = REPO_ROOT / "benchmarks/results"
    assert sorted(p.name for p in results.iterdir() if p.is_file()) == [], "no result outside a benchmark folder"
    files = sorted(results.rglob("*.json"))
    assert len(files) > 20
    missing = {str(f.relative_to(REPO_ROOT)): MANIFEST_FIELDS - set(json.loads(f.read_text()).get("manifest", {}))
               for f in files}
    assert {name: fields for name, fields in missing.items() if fields} == {}


# a path right after `--out ` is where a command wrote, not a citation
CITED = re.compile(r"(?<!--out )(?:\b([0-9a-f]{7,40}):)?(benchmarks/results/[\w./-]+\.(?:json|png))")


def cited_results(text: str) -> list[tuple[str | None, str]]:
    """(commit or None, path) of every results file a text cites: `benchmarks/results/…` as it is now, or
    `<commit>:benchmarks/results/…` for a superseded file git keeps."""
    return [(commit or None, path.rstrip(".")) for commit, path in CITED.findall(text)]


def test_every_results_file_the_documents_cite_exists_now_or_in_its_commit():
    documents = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    missing = []
    for document in documents:
        for commit, path in cited_results(document.read_text(encoding="utf-8")):
            if commit is None:
                found = (REPO_ROOT / path).is_file()
            else:
                found = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=REPO_ROOT,
                                       capture_output=True).returncode == 0
            if not found:
                missing.append(f"{document.name}: {commit + ':' if commit else ''}{path}")
    assert missing == []


def test_a_citation_of_a_results_file_that_is_gone_is_seen():
    now = "benchmarks/results/harness/amx-2c.json"
    assert cited_results(f"see `{now}`.") == [(None, now)]
    assert cited_results("(`0123abcd:benchmarks/results/old.json`)") == [("0123abcd", "benchmarks/results/old.json")]
    assert cited_results("`python benchmarks/x.py --out benchmarks/results/x.json`") == []

