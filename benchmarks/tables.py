"""The results tables of README.md and docs/, generated from the files under benchmarks/results/.

    python -m benchmarks.tables           # rewrite every block between the markers (make results)
    python -m benchmarks.tables --check   # exit 1 naming each block that differs from the data (make results-check)

A block is `<!-- generated: NAME -->`, the table, `<!-- end generated -->`. --check also fails on a Markdown table row
with a three-decimal figure outside a block in any of the documents: a figure in a table comes from a results file,
or it is not shown. Reads JSON and the presets' YAML only (no torch, no minigpt), so it runs anywhere in a second.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
TABLE_FIGURE = re.compile(r"^\|.*\d\.\d{3}", re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")  # a value in code (`train.ema_decay` `0.999`) is configuration, not a figure

# the quality table: one row per predictor, one column per machine class with a quality_budget result
LADDER = RESULTS / "baselines_ladder" / "wt2-mini.json"
QUALITY = RESULTS / "quality_budget"
BASELINE_ROWS = (("unigram (train character frequencies)", "unigram (add-one)"),
                 ("{best} (the best static baseline)", None),
                 ("PPMd order 8 (adaptive: keeps learning on val)", "PPMd order 8"))
# a row: its label, then (run name, key) per figure, the first in bold: the preset, without its n-gram (no soft
# targets, no n-gram expert), nanoGPT's recipe on the same clock
RUN_ROWS = (("`budget-72s` / without its n-gram / nanoGPT's CPU recipe, the same 72 s",
             (("budget-72s preset", "val_bpc"), ("budget-72s, no soft targets", "val_bpc"),
              ("nanoGPT recipe, 72 s (reference)", "val_bpc"))),
            ("`budget-15m` / without soft targets / nanoGPT's CPU recipe, the same 15 min",
             (("budget-15m preset", "val_bpc"), ("budget-15m, no soft targets", "val_bpc"),
              ("nanoGPT recipe, 15 min (reference)", "val_bpc"))),
            ("`budget-15m`, dynamic evaluation (adaptive, like PPMd)", (("budget-15m preset", "dynamic_val_bpc"),)))


def _figure(value: float | None, bold: bool = False) -> str:
    if value is None:
        return "–"
    return f"**{value:.3f}**" if bold else f"{value:.3f}"


def _class_title(path: Path, result: dict) -> str:
    machine = result["manifest"]["machine"]
    return f"{path.stem} ({machine['cpu']} {machine.get('cpu_family_model', '')})".replace(" )", ")")


OLDER_PRESET_NOTE = "†: an older version of the preset trained it."
EVALUATE_DEFAULTS = Path("conf/evaluate/default.yaml")
# a figure a run recorded under one key with the settings it used under another, and the evaluate keys they mirror
EVALUATED_WITH = {"dynamic_val_bpc": ("dynamic_evaluation", {"lr": "dynamic_lr", "streams": "dynamic_streams"})}


def older_evaluation(run: dict, key: str, root: Path) -> dict | None:
    """The settings a run's figure `key` was computed with where they differ from conf/evaluate/default.yaml's now
    (only the keys that differ; one the run did not record counts as differing), else None; figures without such
    settings: None."""
    if key not in EVALUATED_WITH or run.get(key) is None:
        return None
    record, keys = EVALUATED_WITH[key]
    defaults = _evaluate_defaults(root)
    used = run.get(record) or {}
    differing = {mine: used.get(mine, "not recorded") for mine, theirs in keys.items()
                 if used.get(mine) != defaults[theirs]}
    return differing or None


@functools.cache
def _evaluate_defaults(root: Path) -> dict:
    """conf/evaluate/default.yaml (read once per run of this module)."""
    return yaml.safe_load((root / EVALUATE_DEFAULTS).read_text())


RECORDED_SECTIONS = ("model", "train", "soft_targets")  # what a quality_budget run records of its configuration


def older_preset(run: dict, root: Path) -> bool:
    """True when a preset's run trained another configuration than the preset composes now: a key its
    conf/experiment/ file sets under a section the run recorded (`model`; `train` and `soft_targets` in newer runs)
    that the recorded section lacks or has at another value. Keys the run's own overrides set are its choice, not the
    preset's (a run without soft targets overrides `train.distill_alpha`); a run that built no soft targets
    (`soft_targets.order` 0) is not older for the other `soft_targets` keys, which then change nothing."""
    presets = [o.split("=", 1)[1] for o in run.get("overrides", []) if o.startswith("experiment=")]
    if not presets:
        return False
    own = {o.split("=", 1)[0].lstrip("+~") for o in run["overrides"]}
    inert = {"soft_targets"} if (run.get("soft_targets") or {}).get("order") == 0 else set()
    return any(f"{section}.{key}" not in own and run[section].get(key) != value
               for section, keys in _preset_sections(root, presets[-1]).items() if section in run
               and section not in inert for key, value in keys.items())


@functools.cache
def _preset_sections(root: Path, preset: str) -> dict[str, dict]:
    """The recorded sections conf/experiment/<preset>.yaml sets, {section: {key: value}} (read once per run of this
    module)."""
    conf = yaml.safe_load((root / "conf" / "experiment" / f"{preset}.yaml").read_text()) or {}
    return {section: dict(conf[section]) for section in RECORDED_SECTIONS if conf.get(section)}


def quality(root: Path) -> str:
    ladder = json.loads((root / LADDER).read_text())
    baselines = {row["name"]: row for row in ladder["rows"]}
    results = [(path, json.loads(path.read_text())) for path in sorted((root / QUALITY).glob("*.json"))]
    header = ["wt2-mini, val bpc", *(_class_title(path, result) for path, result in results)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for label, name in BASELINE_ROWS:
        name = name or ladder["best_static"]
        value = _figure(baselines[name]["val_bpc"])
        lines.append(f"| {label.format(best=name)} | " + " | ".join(value for _ in results) + " |")
    stale, evaluated_otherwise = False, []
    for label, figures in RUN_ROWS:
        cells = []
        for _path, result in results:
            runs = {run["name"]: run for run in result["runs"]}
            values = []
            for i, (name, key) in enumerate(figures):
                run = runs.get(name, {})
                older = older_evaluation(run, key, root)
                if older is not None:
                    evaluated_otherwise.append(", ".join(f"{k} {v}" for k, v in older.items()))
                values.append(_figure(run.get(key), bold=i == 0 and len(figures) > 1)
                              + ("†" if run and older_preset(run, root) else "") + ("‡" if older is not None else ""))
            stale = stale or any("†" in v for v in values)
            cells.append(" / ".join(values))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    sources = f"`{QUALITY.as_posix()}/` (" + ", ".join(f"`{path.name}`" for path, _ in results) + ")"
    note = (f"Baselines: `{LADDER.as_posix()}` (exact counts: the same on every machine); presets and nanoGPT: "
            f"{sources}, one seed per cell, each manifest with its command, commit and machine."
            + (f" {OLDER_PRESET_NOTE}" if stale else "")
            + (f" ‡: evaluated with other settings than `{EVALUATE_DEFAULTS.as_posix()}` sets now ("
               + "; ".join(sorted(set(evaluated_otherwise))) + ")." if evaluated_otherwise else ""))
    lines += ["", *textwrap.wrap(note, 116, break_on_hyphens=False, break_long_words=False)]
    return "\n".join(lines) + "\n"


def results_index(root: Path) -> str:
    """Every results file with what its manifest says: the machine, the commit, the date and the command."""
    lines = ["| results file | machine | commit | date | command |", "| --- | --- | --- | --- | --- |"]
    for path in sorted((root / RESULTS).glob("*/*.json")):
        data = json.loads(path.read_text())
        # a file grown by appending (quality_budget --append): its earlier invocations first, each on its own row
        for n, manifest in enumerate([*data.get("earlier", []), data["manifest"]]):
            machine = manifest["machine"]
            name = " ".join(str(part) for part in (machine.get("cpu") or machine.get("device") or "?",
                                                     machine.get("cpu_family_model")) if part)
            commit = (f"`{manifest['commit'][:10]}`" + (" (backfilled)" if manifest.get("backfilled") else "")
                      + (" + changes" if manifest["commit"].endswith("-dirty") else ""))
            command = manifest["command"].replace("|", "\\|").replace("`", "'")  # a backtick would end the code span
            where = f"`{(RESULTS / path.parent.name / path.name).as_posix()}`" if n == 0 else "(appended)"
            lines.append(f"| {where} | {name} | {commit} | {manifest['date'][:10]} | `{command}` |")
    return "\n".join(lines) + "\n"


def baselines(root: Path) -> str:
    """The whole baseline ladder on wt2-mini, val and test bits per character, the best static baseline in bold."""
    ladder = json.loads((root / LADDER).read_text())
    lines = ["| predictor | kind | val bpc | test bpc |", "| --- | --- | --- | --- |"]
    for row in ladder["rows"]:
        best = row["name"] == ladder["best_static"]
        name = f"{row['name']} (the best static)" if best else row["name"]
        lines.append(f"| {name} | {row['kind']} | {_figure(row['val_bpc'], bold=best)} | {_figure(row['test_bpc'])} |")
    return "\n".join(lines) + "\n"


def discount_grid(root: Path) -> str:
    """Kneser-Ney val bits per character by discount (rows) and order (columns), the lowest in bold."""
    grid = json.loads((root / LADDER).read_text())["discount_grid"]
    orders = sorted({cell["order"] for cell in grid})
    best = min(cell["val_bpc"] for cell in grid)
    lines = ["| D | " + " | ".join(str(order) for order in orders) + " |", "|" + " --- |" * (len(orders) + 1)]
    for discount in sorted({cell["discount"] for cell in grid}):
        row = {cell["order"]: cell["val_bpc"] for cell in grid if cell["discount"] == discount}
        lines.append(f"| {discount} | " + " | ".join(_figure(row[o], bold=row[o] == best) for o in orders) + " |")
    return "\n".join(lines) + "\n"


MIXED_PRESETS = ("budget-72s", "budget-15m")


def mixture(root: Path) -> str:
    """Each preset's best checkpoint alone, the 9-gram alone and the two mixed (val bpc, test in brackets), with the
    weight the mixture gives the 9-gram (1 - w: a run records the model's weight w): the preset runs of every
    quality_budget result (a machine class each), which evaluate with `evaluate.mixture_order=9`."""
    ladder = json.loads((root / LADDER).read_text())
    nine = next(row for row in ladder["rows"] if row["name"] == "9-gram Kneser-Ney")
    lines = ["| val bpc (test) | model | 9-gram alone | model + 9-gram | the 9-gram's weight |",
             "| --- | --- | --- | --- | --- |"]

    def pair(val: float, test: float) -> str:
        return f"{_figure(val)} ({_figure(test)})"

    stale = False
    for path in sorted((root / QUALITY).glob("*.json")):
        runs = {run["name"]: run for run in json.loads(path.read_text())["runs"]}
        for preset in MIXED_PRESETS:
            run = runs.get(f"{preset} preset")
            if run is None or run.get("mixture_val_bpc") is None:
                continue
            older = "†" if older_preset(run, root) else ""
            stale = stale or bool(older)
            lines.append(f"| `experiment={preset}`{older} (best step {run['best_step']:,}; `{path.stem}`) | "
                         f"{pair(run['val_bpc'], run['test_bpc'])} | {pair(nine['val_bpc'], nine['test_bpc'])} | "
                         f"{pair(run['mixture_val_bpc'], run['mixture_test_bpc'])} | {1 - run['mixture_weight']:.2f} |")
    if stale:
        lines += ["", OLDER_PRESET_NOTE]
    return "\n".join(lines) + "\n"


PREFLIGHT_FALSE_ALARMS = RESULTS / "preflight_false_alarms"


def _refusals(counts: dict) -> str:
    """'5/5 (lr_stability 3, rehearsal_learns 2)': how many runs the rehearsal refused, and by which check."""
    by = [f"{check} {counts[f'failed_{check}']}" for check in ("lr_stability", "rehearsal_learns")
          if counts[f"failed_{check}"]]
    return f"{counts['failed']}/{counts['runs']}" + (f" ({', '.join(by)})" if by else "")


def preflight_false_alarms(root: Path) -> str:
    """Per preset: healthy seeds refused (false alarms), the single-step rule's alarms, how far below the bar's base
    the healthy runs end, and the divergent LRs and planted bugs refused, from every preflight_false_alarms result."""
    lines = ["| preset (its LR, precision) | false alarms | the old rule's alarms | healthy: below the base by | "
             "lr 0.1: below the base by; refused | lr 1.0 | updates that never land (planted) | LR zero after warmup "
             "(planted) | rehearsal per seed |", "|" + " --- |" * 9]
    for path in sorted((root / PREFLIGHT_FALSE_ALARMS).glob("*.json")):
        for preset, result in json.loads(path.read_text())["presets"].items():
            healthy, slow, fast = result["healthy"], result["divergent"]["0.1"], result["divergent"]["1.0"]
            broken = result["broken"]
            # a rehearsal towards soft targets says so; older files did not load them (and do not say)
            alpha = f", α {result['distill_alpha']:g}" if result.get("distill_alpha") else ""
            alpha += ", n-gram expert" if result.get("ngram_expert") else ""
            lines.append(
                f"| {preset} ({result['train_lr']:g}, {result['precision']}{alpha}; `{path.stem}`) | "
                f"**{healthy['failed']}**/{healthy['runs']} | {healthy['old_rule_alarms']} | "
                f"{healthy['below_unigram_min']:.3f} … {healthy['below_unigram_max']:.3f}{_below_start(healthy)} | "
                f"{slow['below_unigram_min']:.3f} … {slow['below_unigram_max']:.3f}; refused {_refusals(slow)} | "
                f"refused {_refusals(fast)} | {_refusals(broken['updates_never_land'])} | "
                f"{_refusals(broken['lr_zero_after_warmup'])} | {healthy['seconds_median']:.2f} s |")
    return "\n".join(lines) + "\n"


def _below_start(group: dict) -> str:
    """Under model.ngram_expert, how far the mixture ended below where it started (its bar's other side)."""
    if group.get("below_start_min") is None:
        return ""
    return f" (below its start by {group['below_start_min']:.3f} … {group['below_start_max']:.3f})"


WATCHDOG_FALSE_ALARMS = RESULTS / "watchdog_false_alarms"


def _spread_row(preset: str, where: str, commit: str, val: list[float], test: list[float], ahead: list[float],
                dynamic: Sequence[float] = (), dynamic_mark: str = "") -> str:
    spread = f" ± {statistics.stdev(val):.3f}" if len(val) > 1 else ""
    adaptive = "–"
    if dynamic:
        adaptive = f"{statistics.mean(dynamic):.3f}{dynamic_mark}" + (
            f" ({len(dynamic)} of {len(val)})" if len(dynamic) < len(val) else "")
    return (f"| {preset} | {where} | {commit} | {len(val)} | {statistics.mean(val):.3f}{spread} ({min(val):.3f} – "
            f"{max(val):.3f}) | {statistics.mean(test):.3f} | {adaptive} | {min(ahead):+.3f} … {max(ahead):+.3f} |")


# evaluate settings that add labelled figures (dynamic, mixture) or change only the interval: the static val and test
# bpc of a run that sets them are the preset's
SPREAD_EVALUATE_KEYS = {"evaluate.dynamic", "evaluate.dynamic_lr", "evaluate.dynamic_streams", "evaluate.mixture_order",
                        "evaluate.blocks", "evaluate.bootstrap_resamples", "evaluate.bootstrap_seed"}


def _seeded_preset(run: dict) -> str | None:
    """The preset a quality_budget run trained when its only other overrides are its seed and SPREAD_EVALUATE_KEYS,
    else None."""
    presets = [o.split("=", 1)[1] for o in run["overrides"] if o.startswith("experiment=")]
    others = [o for o in run["overrides"] if not o.startswith(("experiment=", "train.seed="))
              and o.split("=", 1)[0] not in SPREAD_EVALUATE_KEYS]
    return presets[-1] if len(presets) == 1 and not others and re.search(r", seed \d+$", run["name"]) else None


def seed_spread(root: Path) -> str:
    """Each preset's trained runs per machine (a results file of a class may hold several CPUs) and their commit (a
    run's own where it records one, else its file's latest manifest's; "backfilled" as in the results index): runs,
    val bpc mean ± sd and range, test mean, the mean of the dynamic-evaluation val figures of the runs that measured
    one ("k of n" when not all did; ‡ when one used other settings than conf/evaluate/default.yaml's), and val minus
    the best static baseline's, from the seeded preset runs of every quality_budget result (runs named "…, seed N"
    whose other overrides are SPREAD_EVALUATE_KEYS only) and the rows of every watchdog_false_alarms result."""
    best_static = json.loads((root / LADDER).read_text())
    best_val = next(row["val_bpc"] for row in best_static["rows"] if row["name"] == best_static["best_static"])
    lines = ["| preset | machine (results file) | commit | runs | val bpc: mean ± sd (range) | test bpc | "
             "dynamic val bpc | val − the best static |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    stale = otherwise = False
    for path in sorted((root / QUALITY).glob("*.json")):
        data = json.loads(path.read_text())
        seeded = [(preset, run) for run in data["runs"] if "val_bpc" in run and (preset := _seeded_preset(run))]
        for preset in dict.fromkeys(preset for preset, _ in seeded):
            mine = [run for p, run in seeded if p == preset]
            older = "†" if any(older_preset(run, root) for run in mine) else ""
            stale = stale or bool(older)
            machine = f"{data['machine']['cpu']} {data['machine'].get('cpu_family_model', '')}".strip()
            val = [run["val_bpc"] for run in mine]
            commits = sorted({run.get("commit", data["manifest"]["commit"])[:10] for run in mine})
            dynamic = [run for run in mine if run.get("dynamic_val_bpc") is not None]
            evaluated_otherwise = any(older_evaluation(run, "dynamic_val_bpc", root) for run in dynamic)
            otherwise = otherwise or evaluated_otherwise
            lines.append(_spread_row(preset + older, f"{machine} (`quality_budget/{path.stem}`)",
                                     ", ".join(f"`{c}`" for c in commits), val, [run["test_bpc"] for run in mine],
                                     [v - best_val for v in val], [run["dynamic_val_bpc"] for run in dynamic],
                                     "‡" if evaluated_otherwise else ""))
    for path in sorted((root / WATCHDOG_FALSE_ALARMS).glob("*.json")):
        data = json.loads(path.read_text())
        rows = [row for row in data["rows"] if "val_bpc" in row]
        for preset, machine in dict.fromkeys((row["preset"], row["machine"]) for row in rows):
            mine = [row for row in rows if (row["preset"], row["machine"]) == (preset, machine)]
            commit = f"`{data['manifest']['commit'][:10]}`" + (" (backfilled)" if data["manifest"].get("backfilled")
                                                                   else "")
            lines.append(_spread_row(preset, f"{machine} (`watchdog_false_alarms/{path.stem}`)", commit,
                                     [row["val_bpc"] for row in mine],
                                     [row["test_bpc"] for row in mine], [row["vs_best_static_bpc"] for row in mine]))
    notes = [OLDER_PRESET_NOTE] if stale else []
    if otherwise:
        notes.append(f"‡: dynamic evaluation with other settings than `{EVALUATE_DEFAULTS.as_posix()}` sets now.")
    if notes:
        lines += ["", " ".join(notes)]
    return "\n".join(lines) + "\n"


EXP_RUN_TIME = RESULTS / "exp_run_time"
TIMED_STAGES = ("preflight", "train", "evaluate", "generate", "report")


def exp_run_time(root: Path) -> str:
    """Per machine and run of exp_run_time: `dvc exp run` to metrics, the data stages' and each later stage's wall
    clock (what its process reported), what is left for DVC and the processes' start-up; the one-time machine
    command."""
    lines = [f"| machine (results file), preset | run | to metrics | data stages | {' | '.join(TIMED_STAGES)} | "
             "DVC and start-ups | machine command |", "|" + " --- |" * (6 + len(TIMED_STAGES))]
    for path in sorted((root / EXP_RUN_TIME).glob("*.json")):
        data = json.loads(path.read_text())
        machine = " ".join(str(data["machine"].get(key) or "") for key in ("cpu", "cpu_family_model")).strip()
        for n, (run, timing) in enumerate(data["runs"].items()):
            stages = timing["stages"]
            cells = [f"{stages[s]['wall_s']:.1f} s ({stages[s]['in_process_s']:.1f})" if s in stages else "–"
                     for s in TIMED_STAGES]
            data_stages = [stage for name, stage in stages.items() if name not in TIMED_STAGES]
            data_cell = (f"{sum(st['wall_s'] for st in data_stages):.1f} s "
                         f"({sum(st['in_process_s'] or 0.0 for st in data_stages):.1f})") if data_stages else "cached"
            reported = sum(stage["in_process_s"] or 0.0 for stage in stages.values())
            where = f"{machine} (`{path.stem}`), {data['preset']}" if n == 0 else ""
            once = f"{data['machine_command_s']:.1f} s" if n == 0 else ""
            lines.append(f"| {where} | {run} | **{timing['total_s']:.1f} s** | {data_cell} | {' | '.join(cells)} | "
                         f"{timing['total_s'] - reported:.1f} s | {once} |")
    return "\n".join(lines) + "\n"


DYNAMIC_SETTINGS = RESULTS / "dynamic_settings"


def dynamic_settings(root: Path) -> str:
    """Per results file (a machine class each, one checkpoint), dynamic evaluation's val and test bpc for each
    (lr, streams) compared, with the Adam steps and seconds a split took; the setting conf/evaluate/default.yaml
    ships in bold."""
    defaults = _evaluate_defaults(root)
    lines = ["| checkpoint (results file) | lr | streams | val bpc | test bpc | steps per val | seconds per val |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted((root / DYNAMIC_SETTINGS).glob("*.json")):
        result = json.loads(path.read_text())
        step = result["checkpoint"]["best_step"]
        where = f"{result['checkpoint']['label']}, best step {'–' if step is None else f'{step:,}'} (`{path.stem}`)"
        for row in result["rows"]:
            shipped = (row["lr"], row["streams"]) == (defaults["dynamic_lr"], defaults["dynamic_streams"])
            lines.append(f"| {where} | {row['lr']:g} | {row['streams']} | {_figure(row['val']['bpc'], shipped)} | "
                         f"{_figure(row['test']['bpc'])} | {row['val']['steps']:,} | {row['val']['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


TABLES = {"quality": quality, "results-index": results_index, "baselines": baselines, "mixture": mixture,
          "preflight-false-alarms": preflight_false_alarms, "seed-spread": seed_spread, "discount-grid": discount_grid,
          "exp-run-time": exp_run_time, "dynamic-settings": dynamic_settings}


def documents(root: Path) -> list[Path]:
    return [path for pattern in DOCUMENTS for path in sorted(root.glob(pattern))]


def regenerate(text: str, root: Path) -> tuple[str, list[str]]:
    """The text with every block rendered from the data, and the names of the blocks that changed."""
    changed = []

    def render(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise SystemExit(f"unknown generated table {name!r}; known: {', '.join(sorted(TABLES))}")
        body = TABLES[name](root)
        if body != match["body"]:
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(render, text), changed


def typed_figures(text: str) -> list[int]:
    """Line numbers of Markdown table rows with a three-decimal figure outside the generated blocks."""
    outside = CODE_SPAN.sub("", BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text))
    return [outside.count("\n", 0, m.start()) + 1 for m in TABLE_FIGURE.finditer(outside)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project folder (default: this checkout)")
    args = parser.parse_args(argv)
    problems = []
    for path in documents(args.root):
        text = path.read_text(encoding="utf-8")
        new, changed = regenerate(text, args.root)
        where = path.relative_to(args.root).as_posix()
        if args.check:
            problems += [f"{where}: table '{name}' differs from benchmarks/results (run `make results`)"
                         for name in changed]
            problems += [f"{where}:{line}: a table row with a three-decimal figure outside a generated block "
                         "(generate it from a results file)" for line in typed_figures(text)]
        elif changed:
            path.write_text(new, encoding="utf-8")
            print(f"{where}: regenerated {', '.join(changed)}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
