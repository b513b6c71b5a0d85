"""The baseline ladder on a corpus: the real data stages (fetch -> encode, baselines) in a scratch project, then
each predictor's val and test bits per character, as the `baselines` stage scores them.

    python benchmarks/baselines_ladder.py --corpus ../shared/wt2-mini \
        --out benchmarks/results/baselines_ladder/wt2-mini.json

The figures depend on the corpus and conf/baselines/, not on the machine (counting is exact); the seconds do.
--smoke runs it on the tests' fixture corpus.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench_common import machine_label, prepare_project, synthetic_corpus, write_result


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
    rows = [{"name": r["name"], "kind": r["kind"], "val_bpc": r["val"]["bpc"], "test_bpc": r["test"]["bpc"],
             "seconds": r.get("seconds")} for r in ladder["rows"]]
    write_result(args.out, {"machine": machine_label(), "corpus": "fixture" if args.smoke else str(corpus),
                            "best_static": ladder["best_static"], "rows": rows})
    for row in rows:
        print(f"{row['name']:24s} val {row['val_bpc']:.3f}  test {row['test_bpc']:.3f}")


if __name__ == "__main__":
    main()
