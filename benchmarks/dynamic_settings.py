"""Dynamic evaluation's settings (evaluate.dynamic_lr, evaluate.dynamic_streams) compared on one trained checkpoint.

    python benchmarks/dynamic_settings.py --work /tmp/w15 --label 'budget-15m preset' --settings 1e-4,16 1e-4,1
    python benchmarks/dynamic_settings.py --smoke --out FILE    # seconds (CI): a 3-second model on the fixture

--work is a project folder holding models/mini_gpt_best.pt, its tokenizer and data/encoded (quality_budget.py's
--work after a run, or the project itself). Each setting "LR,STREAMS" scores val and test under dynamic evaluation
as the evaluate stage does (minigpt.evaluate.dynamic: the split in STREAMS contiguous segments, sliding windows of
stride block_size // 2, one Adam step of LR after each window is scored), in the precision evaluate would choose
here, and records the bits per character and the seconds each split took. --smoke trains the budget-72s preset
for 3 s on the tests' synthetic fixture first: the code paths once, not a result.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench_common import ROOT, machine_label, output_path, trained_smoke_project, write_result
from minigpt.core.paths import BEST_CHECKPOINT, ENCODED_DIR, TOKENIZER_FILE
from minigpt.data.encode import load_ids
from minigpt.evaluate.checkpoint_eval import expert_priors
from minigpt.evaluate.dynamic import dynamic_score
from minigpt.model.checkpoint import load_trained_model
from minigpt.model.precision import choose_evaluation_precision

DEFAULT_SETTINGS = ["1e-4,16", "1e-4,4", "3e-4,4", "1e-4,1", "3e-4,1", "3e-5,1"]
EVALUATION_BATCH = 64  # evaluate.batch_size's default: the batch evaluate times the precision choice with


def setting(text: str) -> tuple[float, int]:
    lr, streams = text.split(",")
    return float(lr), int(streams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work", help="a trained project folder")
    parser.add_argument("--label", help="what trained the checkpoint, recorded with the results (default: --work)")
    parser.add_argument("--settings", nargs="+", type=setting, default=[setting(s) for s in DEFAULT_SETTINGS],
                        metavar="LR,STREAMS")
    parser.add_argument("--smoke", action="store_true", help="train 3 s on the synthetic fixture first (CI)")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/dynamic_settings/<machine class>.json")
    args = parser.parse_args()
    if args.smoke:
        args.work, args.label = trained_smoke_project("minigpt-dynamic-"), "smoke: budget-72s, 3 s, fixture"
        args.settings = [(1e-4, 4), (1e-4, 1)]
    label = args.label or str(args.work)
    device = torch.device("cpu")
    model, tokenizer, checkpoint = load_trained_model(args.work / BEST_CHECKPOINT, args.work / TOKENIZER_FILE, device)
    precision = choose_evaluation_precision(model, "auto", EVALUATION_BATCH, device)["choice"]
    stride = max(1, model.config.block_size // 2)
    ids = {split: load_ids(args.work / ENCODED_DIR, split) for split in ("val", "test")}
    char_counts = tokenizer.char_counts()
    priors = expert_priors(model, checkpoint, args.work, str(args.work / BEST_CHECKPOINT), None)  # model.ngram_expert
    rows = []
    for lr, streams in args.settings:
        row = {"lr": lr, "streams": streams}
        for split, split_ids in ids.items():
            started = time.perf_counter()
            scored = dynamic_score(model, split_ids, stride, streams, lr, device, precision, char_counts,
                                   priors.get(split))
            row[split] = {"bpc": scored["bpc"], "steps": scored["steps"], "streams": scored["streams"],
                          "seconds": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(f"lr {lr:g}, {streams} stream(s): val {row['val']['bpc']:.4f} ({row['val']['steps']} steps, "
              f"{row['val']['seconds']:.0f} s), test {row['test']['bpc']:.4f}", flush=True)
    out = output_path(args.out, "dynamic_settings", args.smoke)
    best_step = checkpoint.get("best_step", checkpoint.get("step"))
    write_result(out, {"machine": machine_label(),
                       "checkpoint": {"label": label, "best_step": best_step, "model": checkpoint["config"]},
                       "precision": precision, "stride": stride, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
