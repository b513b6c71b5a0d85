"""Preflight's rehearsal over many seeds: false alarms of the correct pipeline at every shipped preset, the
divergent LRs it must refuse, and the learning bar's calibration (healthy vs broken training steps).

    python benchmarks/preflight_false_alarms.py --corpus ../shared/wt2-mini --seeds 100
    python benchmarks/preflight_false_alarms.py --smoke        # the code paths on the tests' fixture (CI)

For each preset and seed it runs the rehearsal checks (lr_stability, rehearsal_learns) exactly as preflight
does (towards the preset's soft targets under train.distill_alpha, mixed with them under model.ngram_expert), with
preflight.seed = seed, and records both
verdicts, the fixed-batch loss before/after and the largest sustained rise. It also records what the previous rule
(any single step's loss > the first + 0.5, or the mean of the last 3 above the first) would have said. Broken
variants plant a bug in the training step or schedule.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from bench_common import (
    compose_project,
    machine_label,
    output_path,
    prepare_project,
    refresh_tokens,
    synthetic_corpus,
    write_result,
)
from minigpt.data.tokenizer_files import load_tokenizer
from minigpt.model.devices import select_device
from minigpt.model.gpt import MiniGPTConfig
from minigpt.preflight.checks import run_checks
from minigpt.preflight.context import Context
from minigpt.preflight.suite import CHECKS
from minigpt.preflight.training_checks import running_median
from minigpt.testing.planted_bugs import (
    lr_zero_after_warmup,
    zero_grad_between_backward_and_step,
)
from minigpt.train import (
    train_step,
)

PRESETS = {"debug": ["experiment=debug"], "production": [], "budget-72s": ["experiment=budget-72s"],
           "budget-15m": ["experiment=budget-15m"]}
# the budget presets train the shape preflight picks on the machine; these are the ones the rule picked on the
# calibration machines (docs/data-and-config.md, "Budget shapes"), checked here without timing
BUDGET_SHAPE = {"budget-72s": "small", "budget-15m": "production"}
REHEARSAL = ("lr_stability", "rehearsal_learns")
# soft_targets loads what a distilled rehearsal trains towards (the run's objective under train.distill_alpha)
PREREQUISITES = {"files", "tokenizer", "token_ids", "soft_targets"}


BROKEN = {"updates_never_land": ("training_step", zero_grad_between_backward_and_step),
          "lr_zero_after_warmup": ("cosine", lr_zero_after_warmup)}


@contextmanager
def planted(name: str | None):
    if name is None:
        yield
        return
    what, fn = BROKEN[name]
    module, attr = (train_step, "training_step") if what == "training_step" else (train_step, "cosine_with_warmup")
    real = getattr(module, attr)
    setattr(module, attr, fn)
    try:
        yield
    finally:
        setattr(module, attr, real)


def base_context(work: Path, params) -> Context:
    tokenizer = load_tokenizer(work / "data/tokenizer/tokenizer.json")
    ctx = Context(params=params, root=work, device=select_device(params.train.device),
                  model_config=MiniGPTConfig.from_params(params.model, tokenizer.vocab_size))
    results = run_checks(ctx, CHECKS, only=PREREQUISITES)
    bad = [r.name for r in results if r.status != "passed"]
    if bad:
        raise SystemExit(f"prerequisite checks failed: {bad}")
    return ctx


def old_rule(losses: list[float]) -> bool:
    """The rule before this benchmark: any loss above the first + 0.5, or the mean of the last 3 above the first."""
    return max(losses) > losses[0] + 0.5 or sum(losses[-3:]) / 3 > losses[0]


def rehearse_once(base: Context, params, seed: int, lr: float | None = None) -> dict:
    train = params.train if lr is None else params.train.model_copy(update={"lr": lr})
    run_params = params.model_copy(update={"train": train,
                                           "preflight": params.preflight.model_copy(update={"seed": seed})})
    ctx = Context(params=run_params, root=base.root, device=base.device, model_config=base.model_config,
                  tokenizer=base.tokenizer, meta=base.meta, splits=base.splits, soft_targets=base.soft_targets)
    started = time.perf_counter()
    results = {r.name: r for r in run_checks(ctx, CHECKS, only=set(REHEARSAL))}
    record = ctx.rehearsal or {}
    losses = record.get("losses", [])
    smooth = running_median(losses, 5) if losses else []
    learns = results["rehearsal_learns"]
    return {
        "seed": seed, "lr": train.lr, "seconds": round(time.perf_counter() - started, 3),
        "lr_stability": results["lr_stability"].status, "rehearsal_learns": learns.status,
        "message": next((r.message for r in results.values() if r.status == "failed"), ""),
        "probe_before": record.get("probe_loss_before"), "probe_after": record.get("probe_loss_after"),
        "bar": learns.measured.get("bar"), "unigram_entropy": learns.measured.get("unigram_entropy"),
        "probe_unigram_loss": record.get("probe_unigram_loss"),
        "below_unigram": (record["probe_unigram_loss"] - record["probe_loss_after"])
        if record.get("probe_loss_after") is not None else None,
        # model.ngram_expert: the mixture must also end the margin below where it started
        "below_start": (record["probe_loss_before"] - record["probe_loss_after"])
        if record.get("probe_loss_after") is not None and record.get("probe_ngram_loss") is not None else None,
        # model.ngram_expert: the network's own fixed-batch loss, which lr_stability also needs to fall
        "network_before": record.get("probe_network_loss_before"),
        "network_after": record.get("probe_network_loss_after"),
        "sustained_rise": (max(smooth) - smooth[0]) if smooth else None,
        "single_step_rise": (max(losses) - losses[0]) if losses else None,
        "old_rule_alarm": old_rule(losses) if len(losses) >= 3 else None,
        "steps": len(losses), "nonfinite": record.get("failure") is not None,
    }


def summarise(rows: list[dict]) -> dict:
    def values(key):
        return [r[key] for r in rows if r.get(key) is not None]

    after, rise, below = values("probe_after"), values("sustained_rise"), values("below_unigram")
    return {
        "runs": len(rows),
        "failed": sum(r["lr_stability"] != "passed" or r["rehearsal_learns"] != "passed" for r in rows),
        "failed_lr_stability": sum(r["lr_stability"] == "failed" for r in rows),
        "failed_rehearsal_learns": sum(r["rehearsal_learns"] == "failed" for r in rows),
        "old_rule_alarms": sum(bool(r["old_rule_alarm"]) for r in rows),
        "probe_after_max": max(after, default=None), "probe_after_median": statistics.median(after) if after else None,
        "probe_after_min": min(after, default=None),
        "below_unigram_min": min(below, default=None), "below_unigram_max": max(below, default=None),
        "below_start_min": min(values("below_start"), default=None),
        "below_start_max": max(values("below_start"), default=None),
        "sustained_rise_max": max(rise, default=None),
        "single_step_rise_max": max(values("single_step_rise"), default=None),
        "bar": rows[0]["bar"] if rows else None, "unigram_entropy": rows[0]["unigram_entropy"] if rows else None,
        "seconds_median": statistics.median(r["seconds"] for r in rows) if rows else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a WikiText-format folder (default: the tests' fixture)")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--divergent-lrs", nargs="*", type=float, default=[0.1, 1.0])
    parser.add_argument("--divergent-seeds", type=int, default=5)
    parser.add_argument("--broken", nargs="*", default=list(BROKEN), choices=list(BROKEN))
    parser.add_argument("--broken-seeds", type=int, default=5)
    parser.add_argument("--override", nargs="*", default=[],
                        help="Hydra overrides for every preset (e.g. preflight.rehearsal_steps=60)")
    parser.add_argument("--smoke", action="store_true", help="2 seeds, debug preset, fixture corpus (code paths only)")
    parser.add_argument("--out", type=Path,
                        help="default: benchmarks/results/preflight_false_alarms/<machine class>.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.presets, args.divergent_seeds, args.broken_seeds = 2, ["debug"], 1, 1
    results = {"machine": machine_label(), "corpus": str(args.corpus or "fixture"), "presets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "project"
        corpus = args.corpus or synthetic_corpus(Path(tmp) / "corpus")
        prepare_project(work, corpus)
        for preset in args.presets:
            shape = [f"shape={BUDGET_SHAPE[preset]}"] if preset in BUDGET_SHAPE else []
            params = compose_project(work, corpus, PRESETS[preset] + shape + args.override)
            refresh_tokens(work)  # this preset's soft targets (none where soft_targets.order is 0)
            base = base_context(work, params)
            seeds = range(args.first_seed, args.first_seed + args.seeds)
            healthy = [rehearse_once(base, params, s) for s in seeds]
            entry = {"train_lr": params.train.lr, "precision": params.train.precision,
                     "distill_alpha": params.train.distill_alpha if base.soft_targets is not None else 0.0,
                     "ngram_expert": params.model.ngram_expert,
                     "healthy": summarise(healthy),
                     "healthy_runs": healthy, "divergent": {}, "broken": {}}
            for lr in args.divergent_lrs:
                rows = [rehearse_once(base, params, s, lr) for s in range(1, 1 + args.divergent_seeds)]
                entry["divergent"][str(lr)] = {**summarise(rows), "runs_detail": rows}
            for name in args.broken:
                with planted(name):
                    rows = [rehearse_once(base, params, s) for s in range(1, 1 + args.broken_seeds)]
                entry["broken"][name] = {**summarise(rows), "runs_detail": rows}
            results["presets"][preset] = entry
            h = entry["healthy"]
            print(f"{preset:<11} lr {params.train.lr:g} {params.train.precision}: {h['failed']}/{h['runs']} false "
                  f"alarms (old rule {h['old_rule_alarms']}); fixed-batch loss after "
                  f"{h['probe_after_min']:.3f}..{h['probe_after_max']:.3f}, below the probe's unigram loss by "
                  f"{h['below_unigram_min']:.3f}..{h['below_unigram_max']:.3f} (margin "
                  f"{params.preflight.learn_margin}); max sustained rise {h['sustained_rise_max']:.3f}, single-step "
                  f"{h['single_step_rise_max']:.3f}; {h['seconds_median']:.2f} s/seed", flush=True)
            for label, group in [*(("lr " + k, v) for k, v in entry["divergent"].items()), *entry["broken"].items()]:
                print(f"{'':<11} {label}: refused {group['failed']}/{group['runs']} (lr_stability "
                      f"{group['failed_lr_stability']}, rehearsal_learns {group['failed_rehearsal_learns']}); "
                      f"below the probe's unigram loss by {group['below_unigram_min']}..{group['below_unigram_max']}",
                      flush=True)
    args.out = output_path(args.out, "preflight_false_alarms", args.smoke)
    write_result(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
