"""What `precision: auto` chooses on this machine, per shipped preset: preflight's own timing (the shared training
step of the preset's model and batch, fp32 and bf16 interleaved) and evaluation's (forward passes at
evaluate.batch_size), with the seconds the choice costs.

    python benchmarks/precision_auto.py --corpus ../shared/wt2-mini \
        --out benchmarks/results/precision_auto_<machine>.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from bench_common import (
    compose_project,
    machine_kind,
    machine_label,
    output_path,
    synthetic_corpus,
    write_result,
)
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.model.precision import choose_evaluation_precision, without_timing
from minigpt.train.precision_choice import measure_training

# each preset without this machine's stored choice (machine=none), so auto is timed here
AUTO = ["machine=none", "train.precision=auto"]
PRESETS = {"debug": ["experiment=debug", *AUTO, "evaluate.precision=auto"], "production": AUTO,
           "budget shape small": ["experiment=budget-72s", "shape=small", *AUTO],
           "budget shape production": ["experiment=budget-15m", "shape=production", *AUTO]}
VOCAB = 119  # wt2-mini's vocabulary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="wiki.{train,valid,test}.raw folder (only composes params)")
    parser.add_argument("--smoke", action="store_true", help="the debug preset only")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/precision_auto/<machine class>.json")
    args = parser.parse_args()
    label = machine_label()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        corpus = args.corpus or synthetic_corpus(Path(scratch) / "corpus")
        for preset, overrides in PRESETS.items():
            if args.smoke and preset != "debug":
                continue
            params = compose_project(Path(scratch), corpus, overrides)
            device = torch.device("cpu")
            train = without_timing("auto", device) or measure_training(params, VOCAB, device)
            model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB)).eval()
            evaluate = choose_evaluation_precision(model, params.evaluate.precision, params.evaluate.batch_size, device)
            rows.append({"preset": preset, "machine": machine_kind(label), "train": train, "evaluate": evaluate})
            print(f"{preset:<11} train: {train['choice']} (fp32 {train.get('fp32_tokens_per_s', 0):,.0f}, bf16 "
                  f"{train.get('bf16_tokens_per_s', 0):,.0f} tok/s, {train.get('seconds', 0):.1f} s); evaluate: "
                  f"{evaluate['choice']} (fp32 {evaluate.get('fp32_tokens_per_s', 0):,.0f}, bf16 "
                  f"{evaluate.get('bf16_tokens_per_s', 0):,.0f} tok/s, {evaluate.get('seconds', 0):.1f} s)", flush=True)
    args.out = output_path(args.out, "precision_auto", args.smoke)
    write_result(args.out, {"machine": label, "smoke": args.smoke, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
