"""Seed groups: runs whose params differ only in their seeds are one setting trained several times. A group is
summarised by its mean and standard deviation, its curves drawn as a band, and two groups are compared by the
difference of their means with an interval that holds both training noise and text noise
(minigpt.evaluate.intervals.group_difference)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from minigpt.evaluate.intervals import group_difference
from minigpt.report.paired import (
    SPLITS,
    characters,
    difference_line,
    own_characters,
    resampling,
    unpairable,
    verdict_of,
)
from minigpt.report.run_files import RunFiles, flat_params

# the params that only reseed a run (sampling's seed changes the samples, not the model)
SEED_KEYS = ("train.seed", "preflight.seed", "generate.seed")


@dataclass
class SeedGroup:
    label: str  # the params that set the group apart from the others ("train.lr=0.001"), or its run's name
    runs: list[RunFiles]

    @property
    def seeds(self) -> list:
        return [flat_params(run).get("train.seed") for run in self.runs]

    def bpcs(self, split: str) -> list[float]:
        """The bpc of every evaluated run of the group."""
        values = [((run.evaluation or {}).get(split) or {}).get("bpc") for run in self.runs]
        return [v for v in values if isinstance(v, (int, float))]

    def summary(self, split: str) -> dict:
        """{"n", "mean", "sd"} of the split's bpc over the group's evaluated runs (sd None below two runs)."""
        values = self.bpcs(split)
        return {"n": len(values), "mean": statistics.fmean(values) if values else None,
                "sd": statistics.stdev(values) if len(values) > 1 else None}


def _setting(run: RunFiles) -> tuple:
    return tuple(sorted((key, repr(value)) for key, value in flat_params(run).items() if key not in SEED_KEYS))


def seed_groups(runs: list[RunFiles]) -> list[SeedGroup]:
    """The runs grouped by every param but the seeds, in the order the runs come (a group where its first run is)."""
    by_setting: dict[tuple, list[RunFiles]] = {}
    for run in runs:
        by_setting.setdefault(_setting(run), []).append(run)
    settings = [dict(setting) for setting in by_setting]
    differing = sorted(key for key in set().union(*settings) if len({s.get(key) for s in settings}) > 1)
    groups = []
    for setting, members in zip(settings, by_setting.values()):
        label = ", ".join(f"{key}={setting[key]}" if key in setting else f"{key} unset" for key in differing)
        groups.append(SeedGroup(label or members[0].name, members))
    return groups


def has_groups(groups: list[SeedGroup]) -> bool:
    """Whether any setting was trained more than once (otherwise the runs are compared one by one)."""
    return any(len(group.runs) > 1 for group in groups)


def group_split(a: SeedGroup, b: SeedGroup, split: str) -> dict:
    """{"a", "b", "difference", "ci95", "se_seeds", "se_text", "df", "verdict"}: B's mean bpc minus A's on one
    split, or {"verdict": why the groups cannot be compared}."""
    scored = []  # per group, (run, its kept blocks of the split) for the runs that have them
    for group in (a, b):
        pairs = [(run, (run.eval_blocks or {}).get("splits", {}).get(split)) for run in group.runs]
        scored.append([(run, kept) for run, kept in pairs if kept])
        if len(scored[-1]) < 2:
            return {"verdict": f"not comparable as groups: {group.label} has {len(scored[-1])} evaluated run(s) "
                               "with reports/eval_blocks.json; a group needs two seeds or more"}
    every = scored[0] + scored[1]
    why = unpairable([run for run, _ in every], [kept for _, kept in every])
    if why:
        return {"verdict": why}
    # a group's runs share their tokenizer, so one run's characters per block stand for its group's
    first_a, first_b = scored[0][0][1], scored[1][0][1]
    result = group_difference([k["nll"] for _, k in scored[0]], [k["nll"] for _, k in scored[1]],
                              characters(first_a), *resampling(a.runs[0]), chars_b=own_characters(first_a, first_b))
    return {**result, "verdict": verdict_of(result["ci95"])}


def mean_sd_text(summary: dict) -> str:
    if summary["mean"] is None:
        return "–"
    return f"{summary['mean']:.4f}" + (f" ± {summary['sd']:.4f}" if summary["sd"] is not None else "")


def groups_text(groups: list[SeedGroup]) -> str:
    """The terminal form: each group's mean ± sd, then every other group against the first (B - A)."""
    lines = [f"seed groups: runs whose params differ only in {', '.join(SEED_KEYS)}",
             "bits per character, mean ± standard deviation over the group's runs"]
    for i, group in enumerate(groups, 1):
        cells = "   ".join(f"{split} {mean_sd_text(group.summary(split))}" for split in SPLITS)
        lines.append(f"G{i} {group.label}: {len(group.runs)} runs (train.seed "
                     f"{', '.join(str(s) for s in group.seeds)}): {cells}")
        lines.append(f"   runs: {', '.join(run.name for run in group.runs)}")
    first = groups[0]
    lines.append("B - A with A = G1: the difference of the group means; its 95% interval holds the seeds' spread "
                 f"(Welch's t)\nand the text's (paired bootstrap of the blocks, {resampling(first.runs[0])[0]} "
                 "resamples)")
    lines.append(f"{'B':<4}{'split':<6} {'A':>8} {'B':>8} {'B - A':>9}  {'95% interval':<21} verdict")
    lines += [difference_line(f"{'G' + str(i):<4}{split:<6}", group_split(first, group, split))
              for i, group in enumerate(groups[1:], 2) for split in SPLITS]
    return "\n".join(lines)
