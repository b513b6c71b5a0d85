"""fp32 vs bf16 autocast on the same run: loss curves side by side, from the real training loop.

    python benchmarks/precision_curves.py --corpus ../shared/wt2-mini [--steps 300] [--preset production]

Both runs share the seed, data, batches and schedule; only train.precision differs. Writes
benchmarks/results/precision_curves.{json,png} (train loss per step, val loss at each eval, tokens/s).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_common import (
    ROOT,
    clear_checkpoints,
    compose_project,
    machine_label,
    prepare_project,
    results_path,
    write_result,
)
from minigpt.core.paths import TRAIN_LOG
from minigpt.train.loop import train


def run(work: Path, corpus: Path, preset: str, steps: int, precision: str) -> dict:
    preset_override = [] if preset == "production" else [f"experiment={preset}"]
    params = compose_project(work, corpus,
                             [*preset_override, f"train.max_steps={steps}", f"train.precision={precision}",
                                            f"train.eval_every={max(1, steps // 6)}", "train.sample_length=0"])
    clear_checkpoints(work)
    summary = train(params, work, require_gate=False, out=lambda msg: print(f"  {msg}", flush=True))
    log = [json.loads(line) for line in (work / TRAIN_LOG).read_text().splitlines()]
    return {"precision": precision, "tokens_per_sec_median": summary["tokens_per_sec_median"],
            "train_loss": [r["train_loss"] for r in log],
            "val": [[r["step"], r["val_loss"]] for r in log if "val_loss" in r]}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ax.plot(range(1, len(r["train_loss"]) + 1), r["train_loss"], alpha=0.5,
                label=f"train, {r['precision']} ({r['tokens_per_sec_median']:,.0f} tok/s)")
        ax.plot(*zip(*r["val"]), "o-", label=f"val, {r['precision']}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/char)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a folder with wiki.{train,valid,test}.raw")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--preset", default="production", help="production, or an experiment name (debug, ...)")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work")
    parser.add_argument("--out", type=Path, help="FILE.json and FILE.png (default: "
                        "benchmarks/results/precision_curves/<machine class>.json and .png)")
    args = parser.parse_args()
    prepare_project(args.work, args.corpus)
    results = [run(args.work, args.corpus, args.preset, args.steps, p) for p in ("fp32", "bf16")]
    args.out = args.out or results_path("precision_curves")
    write_result(args.out.with_suffix(".json"), {"machine": machine_label(), "preset": args.preset,
                                                 "steps": args.steps, "runs": results})
    plot(results, args.out.with_suffix(".png"))
    for r in results:
        print(f"{r['precision']}: {r['tokens_per_sec_median']:,.0f} tok/s, val loss " +
              ", ".join(f"{v:.4f}@{s}" for s, v in r["val"]))
    print(f"wrote {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
