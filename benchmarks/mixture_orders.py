"""The model mixed with n-grams of several orders (minigpt.evaluate.mixture), from one trained checkpoint.

    python benchmarks/mixture_orders.py --work benchmarks/.work --orders 5 7 9 11 --out FILE
    python benchmarks/mixture_orders.py --smoke --out FILE    # seconds (CI): a 3-second model on the fixture

--work is a project folder holding models/mini_gpt_best.pt and data/encoded (the quality benchmark's scratch
folder after a run, or the project itself). The model scores val and test once (static, the evaluate stage's
sliding windows with stride block_size // 2, fp32); each order's n-gram is counted on the encoded train split and
mixed with it as `evaluate.mixture_order` does (val cross-fitted over its halves, test with val's weight).
--smoke trains the budget-72s preset for 3 s on the tests' synthetic fixture first, then mixes orders 3 and 5 with
it: the code paths once, not a result.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from bench_common import ROOT, machine_label, trained_smoke_project
from minigpt.core.io_utils import atomic_write_text
from minigpt.core.paths import BEST_CHECKPOINT, ENCODED_DIR
from minigpt.data.encode import load_ids
from minigpt.evaluate.checkpoint_eval import expert_priors
from minigpt.evaluate.mixture import mixture_figures
from minigpt.evaluate.scoring import target_nll
from minigpt.model.checkpoint import load_checkpoint, model_from_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work", help="a trained project folder")
    parser.add_argument("--orders", type=int, nargs="+", default=[5, 7, 9, 11])
    parser.add_argument("--discount", type=float, default=0.9, help="the n-grams' discount (baselines.discount)")
    parser.add_argument("--smoke", action="store_true", help="train 3 s on the synthetic fixture first (CI)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.smoke:
        args.work, args.orders = trained_smoke_project("minigpt-mixture-"), [3, 5]
    checkpoint = load_checkpoint(args.work / BEST_CHECKPOINT)
    model = model_from_checkpoint(checkpoint, torch.device("cpu"), "best")
    ids = {split: load_ids(args.work / ENCODED_DIR, split) for split in ("train", "val", "test")}
    started = time.perf_counter()
    priors = expert_priors(model, checkpoint, args.work, str(args.work / BEST_CHECKPOINT), None)  # model.ngram_expert
    nll = {s: target_nll(model, ids[s], max(1, model.config.block_size // 2), 64, torch.device("cpu"), "fp32",
                         priors.get(s)) for s in ("val", "test")}
    model_row = {s: float(nll[s].mean() / math.log(2)) for s in nll}  # bpc: one character per target (char only)
    print(f"model: val {model_row['val']:.4f}, test {model_row['test']:.4f} bpc per token "
          f"({time.perf_counter() - started:.0f} s)")
    scored = {s: (ids[s], nll[s], np.ones(len(nll[s]), dtype=np.int64)) for s in nll}
    rows = []
    for order in args.orders:
        started = time.perf_counter()
        mixture = mixture_figures(ids["train"], scored, model.config.vocab_size, order, args.discount)
        row = {"order": order, "ngram_val": mixture["ngram"]["val"]["bpc"],
               "ngram_test": mixture["ngram"]["test"]["bpc"],
               "mixture_val": mixture["val"]["bpc"], "mixture_test": mixture["test"]["bpc"],
               "ngram_weight": 1 - mixture["weight"], "weights_of_val_halves": mixture["weights_of_val_halves"],
               "seconds": time.perf_counter() - started}
        rows.append(row)
        print(f"{order:>2}-gram: alone val {row['ngram_val']:.4f} test {row['ngram_test']:.4f}; mixed val "
              f"{row['mixture_val']:.4f} test {row['mixture_test']:.4f}; n-gram weight {row['ngram_weight']:.3f}")
    out = {"machine": machine_label(), "work": str(args.work), "checkpoint_step": checkpoint.get("best_step"),
           "model_bits_per_token": model_row, "rows": rows}
    atomic_write_text(args.out, json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
