"""The baseline ladder on a corpus: the real data stages (fetch -> encode, baselines) in a scratch project, then
each predictor's val and test bits per character, as the `baselines` stage scores them.

    python benchmarks/baselines_ladder.py --corpus ../shared/wt2-mini \
        --out benchmarks/results/baselines_ladder/wt2-mini.json

The figures depend on the corpus and conf/baselines/, not on the machine (counting is exact); the seconds do.
It also scores val with Kneser-Ney over a grid of discounts and orders (DISCOUNTS x ORDERS: how
`baselines.discount` and `baselines.ngram_orders` were chosen). --smoke runs it on the tests' fixture corpus.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from bench_common import machine_label, prepare_project, synthetic_corpus, write_result
from minigpt.core.config import load_params
from minigpt.evaluate.baselines import character_ids
from minigpt.evaluate.ngram import kneser_ney_bits

DISCOUNTS = (0.6, 0.75, 0.9, 1.0)
ORDERS = (3, 5, 7, 8, 9, 10, 12)


def discount_grid(work: Path) -> list[dict]:
    """Val bits per character of Kneser-Ney at each discount and order, counted on the scratch project's clean train
    as the baselines stage counts it."""
    params = load_params(work / "params.yaml")
    ids, vocab, _hashes = character_ids(work / "data/clean", params.clean.placeholder)
    grid = []
    for discount in DISCOUNTS:
        bits = kneser_ney_bits(ids["train"], {"val": ids["val"]}, vocab, list(ORDERS), discount)
        grid += [{"discount": discount, "order": order, "val_bpc": float(np.mean(bits[order]["val"]))}
                 for order in ORDERS]
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a folder with wiki.{train,valid,test}.raw (default: the fixture)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="the fixture corpus")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / "project"
        corpus = synthetic_corpus(Path(scratch) / "corpus") if args.smoke or args.corpus is None else args.corpus
        prepare_project(work, corpus)
        ladder = json.loads((work / "data/baselines/baselines.json").read_text())
        grid = discount_grid(work)
    rows = [{"name": r["name"], "kind": r["kind"], "val_bpc": r["val"]["bpc"], "test_bpc": r["test"]["bpc"],
             "seconds": r.get("seconds")} for r in ladder["rows"]]
    write_result(args.out, {"machine": machine_label(), "corpus": "fixture" if args.smoke else str(corpus),
                            "best_static": ladder["best_static"], "rows": rows, "discount_grid": grid})
    for row in rows:
        print(f"{row['name']:24s} val {row['val_bpc']:.3f}  test {row['test_bpc']:.3f}")


if __name__ == "__main__":
    main()
