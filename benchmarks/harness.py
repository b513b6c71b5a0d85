"""The benchmark harness: one command prints a table and writes benchmarks/results.json.

    python benchmarks/harness.py                 # the measurements (several minutes on 2 cores)
    python benchmarks/harness.py --smoke         # seconds: every code path once, tiny sizes (CI runs this)

Timings on shared machines are noisy: every figure is a median of several rounds, and variants that are
compared are measured side by side (interleaved) in the same run, so the ratios are what to read.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench_common import ROOT, flops_per_token, model_preset  # noqa: E402  (also puts the repo on sys.path)
from minigpt import model as model_module  # noqa: E402
from minigpt.cleaning import clean_splits  # noqa: E402
from minigpt.config import CleanConfig  # noqa: E402
from minigpt.evaluation import score_split  # noqa: E402
from minigpt.model import MiniGPT  # noqa: E402
from minigpt.optim import build_param_groups  # noqa: E402
from minigpt.tokenizer import CharTokenizer  # noqa: E402
from minigpt.training import calc_loss_batch  # noqa: E402



def median_time(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ 1. the peak

def matmul_peak(rounds: int, shapes: list[tuple[int, int, int]]) -> dict:
    """FLOP/s of plain matrix products at the model's shapes, fp32 and bf16, interleaved."""
    out = {}
    for m, k, n in shapes:
        rates = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            a @ b
            rates[str(dtype).split(".")[-1]] = 2 * m * k * n / median_time(lambda: a @ b, rounds)
        out[f"{m}x{k}x{n}"] = rates
    return out


# --------------------------------------------------------------------------------------- 2. training speed

def manual_causal_attention(q, k, v, dropout_p):
    """The debugging guide's attention: explicit scores, a lower-triangular mask, softmax, weighted sum."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return F.dropout(weights, dropout_p) @ v


class Variant:
    def __init__(self, name, config, batch, precision="fp32", baseline=False, compiled=False):
        self.name, self.precision, self.baseline = name, precision, baseline
        torch.manual_seed(0)
        self.model = MiniGPT(config).train()
        groups = build_param_groups(self.model, 0.1)
        # the baseline: a per-parameter (unfused, no foreach) AdamW loop
        self.optimizer = torch.optim.AdamW(groups, lr=1e-3, foreach=False) if baseline else torch.optim.AdamW(groups, lr=1e-3)
        self.run = torch.compile(self.model) if compiled else self.model
        self.x = torch.randint(0, config.vocab_size, (batch, config.block_size))
        self.y = torch.randint(0, config.vocab_size, (batch, config.block_size))

    def steps(self, count: int) -> None:
        real = model_module.causal_attention
        if self.baseline:
            model_module.causal_attention = manual_causal_attention
        try:
            for _ in range(count):
                loss = calc_loss_batch(self.run, self.x, self.y, self.precision)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        finally:
            model_module.causal_attention = real


def training_speed(preset: str, batch: int, vocab: int, steps: int, rounds: int, compile_too: bool, peaks: dict) -> dict:
    config = model_preset(preset, vocab)
    variants = [Variant("baseline (manual attention, unfused AdamW, fp32)", config, batch, baseline=True),
                Variant("fp32 (SDPA, foreach AdamW)", config, batch),
                Variant("bf16 autocast", config, batch, "bf16")]
    if compile_too:
        variants.append(Variant("bf16 autocast + torch.compile", config, batch, "bf16", compiled=True))
    for v in variants:
        v.steps(2)  # warm-up (and compilation)
    samples = {v.name: [] for v in variants}
    for _ in range(rounds):  # interleaved: noise hits every variant alike
        for v in variants:
            samples[v.name].append(batch * config.block_size * steps / median_time(lambda: v.steps(steps), 1))
    params = variants[0].model.num_parameters()
    fpt = flops_per_token(config, params)
    rows = []
    base = statistics.median(samples[variants[0].name])
    for v in variants:
        rate = statistics.median(samples[v.name])
        peak = peaks["bf16"] if v.precision == "bf16" else peaks["fp32"]
        rows.append({"variant": v.name, "tokens_per_sec": rate, "vs_baseline": rate / base,
                     "mfu": rate * fpt / peak, "precision": v.precision})
    return {"preset": preset, "parameters": params, "batch": batch, "block_size": config.block_size,
            "flops_per_token": fpt, "rows": rows}


# ---------------------------------------------------------------------------------------- 4. data stages

def data_stages(text: str, rounds: int) -> dict:
    clean_cfg = CleanConfig("NFC", 3, "\ufffd", False)
    raw = {"train": text, "val": text[: len(text) // 10], "test": text[-len(text) // 10:]}
    cleaned = {}

    def run_clean():
        cleaned.update(clean_splits(raw, clean_cfg)[0])

    clean_s = median_time(run_clean, rounds)
    tokenizer_s = median_time(lambda: CharTokenizer.from_text(cleaned["train"], "\ufffd"), rounds)
    tok = CharTokenizer.from_text(cleaned["train"], "\ufffd")
    encode_s = median_time(lambda: tok.encode(cleaned["train"]), rounds)
    stoi = {ch: i for i, ch in enumerate(tok.chars)}
    sample = cleaned["train"][: max(1, len(cleaned["train"]) // 10)]
    naive_s = median_time(lambda: np.array([stoi[ch] for ch in sample], dtype=np.int64), rounds) * len(cleaned["train"]) / len(sample)
    return {"characters": len(text), "clean_s": clean_s, "tokenizer_s": tokenizer_s, "encode_s": encode_s,
            "naive_encode_s": naive_s, "encode_speedup_vs_naive": naive_s / encode_s,
            "total_s": clean_s + tokenizer_s + encode_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ---------------------------------------------------------------------------------------------- 5. eval

def evaluation_speed(preset: str, vocab: int, tokens: int, rounds: int) -> dict:
    config = model_preset(preset, vocab)
    torch.manual_seed(0)
    model = MiniGPT(config)
    ids = np.random.default_rng(0).integers(0, vocab, tokens)
    stride = config.block_size // 2
    seconds = median_time(lambda: score_split(model, ids, stride, 64, torch.device("cpu")), rounds)
    return {"preset": preset, "tokens": tokens, "stride": stride, "tokens_per_sec": tokens / seconds}


# ---------------------------------------------------------------------------------------------- table

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks the code paths in seconds")
    parser.add_argument("--corpus", type=Path, help="a wiki.train.raw to build the data-stage text from (else synthetic)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile on CPU)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results.json")
    args = parser.parse_args()
    rounds = 1 if args.smoke else 5
    vocab = 119  # wt2-mini's vocabulary
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(), "python": platform.python_version(),
                          "torch": torch.__version__, "threads": torch.get_num_threads()},
              "smoke": args.smoke}

    shapes = [(256, 64, 64)] if args.smoke else [(4096, 256, 1024), (4096, 1024, 256), (2048, 2048, 2048)]
    result["matmul"] = matmul_peak(rounds, shapes)
    peaks = {dt: max(r[dt] for r in result["matmul"].values()) for dt in ("float32", "bfloat16")}
    peaks = {"fp32": peaks["float32"], "bf16": peaks["bfloat16"]}
    result["peak_flops"] = peaks

    if args.smoke:
        result["training"] = [training_speed("debug", 2, vocab, 1, 1, False, peaks)]
    else:
        result["training"] = [training_speed("debug", 8, vocab, 20, rounds, args.compile, peaks),
                              training_speed("production", 32, vocab, 3, rounds, args.compile, peaks)]

    if args.corpus:
        base = args.corpus.read_text(encoding="utf-8")
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from wikitext_fixture import make_texts

        base = make_texts()["wiki.train.raw"]
    target = 20_000 if args.smoke else 13_500_000  # WikiText-2's size
    text = (base * (target // len(base) + 1))[:target]
    result["data_stages"] = data_stages(text, 1 if args.smoke else 3)

    result["evaluation"] = evaluation_speed("debug" if args.smoke else "production", vocab, 2_000 if args.smoke else 60_000, rounds)
    prod_train = next(r for r in result["training"][-1]["rows"] if r["precision"] == "fp32" and "SDPA" in r["variant"])
    result["evaluation"]["vs_training_tokens_per_sec"] = result["evaluation"]["tokens_per_sec"] / prod_train["tokens_per_sec"]

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"\nwrote {args.out}")


def print_table(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['platform']}, torch {m['torch']}, {m['threads']} threads{'  (SMOKE: not timings)' if r['smoke'] else ''}")
    print(f"peak matmul: fp32 {r['peak_flops']['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {r['peak_flops']['bf16'] / 1e9:,.0f} GFLOP/s")
    for t in r["training"]:
        print(f"\ntraining, {t['preset']} ({t['parameters']:,} parameters, batch {t['batch']} x {t['block_size']})")
        print(f"  {'variant':<50} {'tokens/s':>10} {'x base':>7} {'MFU':>6}")
        for row in t["rows"]:
            print(f"  {row['variant']:<50} {row['tokens_per_sec']:>10,.0f} {row['vs_baseline']:>7.2f} {row['mfu']:>6.1%}")
    d = r["data_stages"]
    print(f"\ndata stages on {d['characters']:,} characters: clean {d['clean_s']:.2f}s, tokenizer {d['tokenizer_s']:.2f}s, "
          f"encode {d['encode_s']:.2f}s (naive per-character loop {d['naive_encode_s']:.2f}s: {d['encode_speedup_vs_naive']:.0f}x); "
          f"peak RSS {d['peak_rss_mb']:,.0f} MB")
    e = r["evaluation"]
    print(f"evaluation ({e['preset']}, stride {e['stride']}): {e['tokens_per_sec']:,.0f} tokens/s = "
          f"{e['vs_training_tokens_per_sec']:.1f}x fp32 training tokens/s")


if __name__ == "__main__":
    main()
