"""Where a training step's time goes, op family by op family (torch.profiler, self CPU time), and what each attempt
to shorten the bf16 step buys, side by side in one run (tokens/s and MFU against the bf16 matmul peak measured in
the same run).

    python benchmarks/profile_step.py

With --budget it profiles instead the budget shapes' steps as they train on a CPU without bf16
instructions: each shape in fp32 with its optimizer (Muon), soft targets and batch drawing, split
into the step's phases (forward, backward, clipping, optimizer, Muon's orthogonalisation inside it, drawing the
batch, and what is left: Python between them) and op families, and their FLOP rate against the fp32 matrix
product rate measured in the same run, at the shape's own products and at 2048x2048x2048
(benchmarks/results/profile_step_budget/). With --precision bf16, the bf16 steps of a CPU with bf16 instructions,
against the bf16 matrix product rate.

    python benchmarks/profile_step.py --budget
    python benchmarks/profile_step.py --budget --precision bf16   # profile_step_budget/<machine class>-bf16.json

Attempts that change the model or its numerics are labelled so; the preset keeps only what wins without changing
the loss curve.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from bench_common import (
    SMOKE_SHAPE,
    VOCAB,
    flops_per_token,
    machine_kind,
    machine_label,
    model_preset,
    output_path,
    shape_params,
    write_result,
)
from minigpt.data.soft_target_files import SoftTargets
from minigpt.model.dropout import Dropout
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import distill, train_step
from minigpt.train.optim import build_param_groups

# op-name fragments -> family, first match wins (self time of leaf ops, so nested ops are not counted twice)
FAMILIES = (
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention", "efficient_attention", "_sdpa")),
    ("matrix products", ("addmm", "::mm", "bmm", "linear", "mkldnn", "matmul")),
    ("LayerNorm / RMSNorm", ("layer_norm", "rms_norm")),
    ("GELU / SiLU", ("gelu", "silu")),
    ("dropout", ("dropout", "bernoulli")),
    ("softmax / cross-entropy", ("softmax", "nll_loss", "cross_entropy")),
    ("casts (autocast, dtype copies)", ("_to_copy", "aten::to", "copy_", "_autocast")),
    ("embedding", ("embedding",)),
    ("optimizer arithmetic (AdamW, Muon's momentum)", ("adam", "_foreach_add", "_foreach_mul", "_foreach_lerp",
                                                        "_foreach_addcdiv", "_foreach_sqrt", "_foreach_div",
                                                        "addcdiv", "lerp")),
    ("gradient clipping (norm)", ("norm", "clamp", "_foreach_mul_")),
)


def family(name: str) -> str:
    low = name.lower()
    return next((fam for fam, keys in FAMILIES if any(k in low for k in keys)), "other (add, mul, views, fills)")


# the ranges a budget step is split into: the training step's own (train_step.PHASES) and drawing the batch
RANGES = {"draw": "minigpt.step.draw", **train_step.PHASES}

# the production model's products (and 2048^3), and one small product for --smoke: a CPU without bf16 instructions
# emulates bf16, and there the full set takes minutes
PEAK_SHAPES = ((4096, 256, 1024), (4096, 1024, 256), (2048, 2048, 2048))
SMOKE_PEAK_SHAPES = ((512, 256, 512),)


def matmul_peak(rounds: int = 10, shapes=PEAK_SHAPES, dtype=torch.bfloat16) -> float:
    """matmul FLOP/s in `dtype` at the given (m, k, n) products (the best of them)."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        best = max(best, 2 * m * k * n / statistics.median(times))
    return best


class RandMaskDropout(torch.nn.Module):
    """Dropout with its mask drawn as torch.rand(...) >= p (same distribution, another random stream)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, device=x.device) >= self.p
        return x * keep / (1.0 - self.p)


class Setup:
    def __init__(self, name: str, config, batch: int, precision: str, fused_adamw: bool = False,
                 compile_mlp: bool = False, attention_dropout: bool = True, rand_masks: bool = False,
                 changes_numerics: str = ""):
        torch.manual_seed(0)
        self.name, self.precision, self.changes = name, precision, changes_numerics
        self.model = MiniGPT(config)
        if rand_masks:
            for name, module in list(self.model.named_modules()):
                for child_name, child in list(module.named_children()):
                    if isinstance(child, (torch.nn.Dropout, Dropout)):
                        setattr(module, child_name, RandMaskDropout(child.p))
        if not attention_dropout:  # residual dropout kept; SDPA free to take its fused kernel
            for block in self.model.blocks:
                block.attn.dropout = 0.0
        if compile_mlp:
            for block in self.model.blocks:
                block.mlp = torch.compile(block.mlp)
        self.optimizer = torch.optim.AdamW(build_param_groups(self.model, 0.1), lr=1e-3, betas=(0.9, 0.95),
                                           fused=True if fused_adamw else None)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (batch, config.block_size + 1), generator=gen)
        self.x, self.y = ids[:, :-1], ids[:, 1:]
        self.tokens = batch * config.block_size

    def step(self) -> None:
        train_step.training_step(self.model, self.optimizer, self.x, self.y, 1e-3, self.precision, 1.0)


def profile(setup, steps: int) -> dict:
    """Op families of `steps` steps of setup.step(), in ms per step (self CPU time of leaf ops), the wall time of
    the step's own profiler ranges (RANGES) and of the whole step, per step, under the profiler."""
    for _ in range(2):
        setup.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            setup.step()
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
    by_family: dict[str, float] = defaultdict(float)
    ranges = {event.key: event.cpu_time_total / 1e3 / steps for event in prof.key_averages()
              if event.key in RANGES.values()}
    for event in prof.key_averages():
        if event.key not in ranges:
            by_family[family(event.key)] += event.self_cpu_time_total / 1e3 / steps  # ms per step
    total = sum(by_family.values())
    return {"ms_per_step": round(total, 1), "families": {k: {"ms": round(v, 1), "share": round(v / total, 3)}
                                                         for k, v in sorted(by_family.items(), key=lambda kv: -kv[1])},
            "phase_ms": {phase: round(ranges.get(name, 0.0), 2) for phase, name in RANGES.items()},
            "wall_ms": round(wall_ms, 1)}


class BudgetStep:
    """A budget shape's training step as the loop runs it: the composed model, ScheduledStep (its optimizer and
    schedule), a batch drawn by distill.draw_batch from a corpus-sized tensor, with soft targets of the preset's
    size when it distils (random values: the timing does not depend on them)."""

    def __init__(self, params, corpus_tokens: int = 1_000_000):
        torch.manual_seed(0)
        self.params, train = params, params.train
        self.config = MiniGPTConfig.from_params(params.model, VOCAB)
        self.model = MiniGPT(self.config)
        self.run_step = train_step.ScheduledStep(self.model, train)
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, VOCAB, (corpus_tokens,), generator=gen)
        self.soft = None
        if params.uses_soft_targets():  # distilled towards them, or mixed with them (model.ngram_expert)
            top = params.soft_targets.top
            probs = torch.rand(corpus_tokens, top, generator=gen)
            self.soft = SoftTargets(torch.randint(0, VOCAB, (corpus_tokens, top), generator=gen, dtype=torch.uint8),
                                    (probs / probs.sum(-1, keepdim=True)).half(), {},
                                    torch.rand(corpus_tokens, generator=gen) * 0.1)
        self.gen, self.number = torch.Generator().manual_seed(1), 0
        self.tokens = train.batch_size * self.config.block_size

    def draw(self):
        return distill.draw_batch(self.data, self.params.train.batch_size, self.config.block_size, "cpu", self.gen,
                                  self.soft)

    def step(self) -> None:
        with torch.profiler.record_function(RANGES["draw"]):
            inputs, targets, soft = self.draw()
        self.number += 1
        self.run_step(inputs, targets, self.number, soft=soft)


def shape_products(model: MiniGPT, rows: int) -> tuple[tuple[int, int, int], ...]:
    """The (m, k, n) of a block's matrix products over `rows` positions, read from its linear layers (qkv, the
    attention's output projection, the MLP's input and output projections)."""
    return tuple((rows, layer.in_features, layer.out_features)
                 for layer in model.blocks[0].modules() if isinstance(layer, torch.nn.Linear))


def budget_profile(shape: str, smoke: bool, rounds: int, precision: str = "fp32") -> dict:
    """A budget shape's step in `precision`: phases, op families, tokens/s and its FLOP rate against matmuls in the
    same precision."""
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-profile-step-"))
    params = shape_params(shape, [*(SMOKE_SHAPE if smoke else []), f"train.precision={precision}"], scratch)
    setup = BudgetStep(params)
    steps = 2 if smoke else 10
    prof = profile(setup, steps)
    times = []
    for _ in range(rounds):  # unprofiled: the step's wall time
        start = time.perf_counter()
        setup.step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    step_ms, phases = seconds * 1e3, dict(prof["phase_ms"])
    # under the profiler: the step's wall time less its outermost ranges
    phases["the rest (Python, zero_grad, the LR)"] = round(
        prof["wall_ms"] - sum(v for k, v in phases.items() if k not in train_step.NESTED_PHASES), 2)
    tokens_per_s = setup.tokens / seconds
    rate = tokens_per_s * flops_per_token(setup.config, setup.model.num_parameters())
    peak_rounds = 2 if smoke else 10
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    own = matmul_peak(peak_rounds, shape_products(setup.model, setup.tokens), dtype)
    large_shape = SMOKE_PEAK_SHAPES[0] if smoke else (2048, 2048, 2048)
    large = matmul_peak(peak_rounds, (large_shape,), dtype)
    large_name = "x".join(map(str, large_shape))
    return {"shape": shape, "model": params.model.model_dump(), "optimizer": params.train.optimizer,
            "batch": [params.train.batch_size, setup.config.block_size], "distill_alpha": params.train.distill_alpha,
            "precision": precision, "step_ms": round(step_ms, 1), "tokens_per_s": round(tokens_per_s, 1),
            "flops_per_s": rate, f"{precision}_matmul_flops_per_s": {"shape's products": own, large_name: large},
            f"of_{precision}_matmul": {"shape's products": round(rate / own, 3), large_name: round(rate / large, 3)},
            "profiled_step_ms": prof["wall_ms"], "phase_ms": phases, "families": prof["families"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the debug model, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/profile_step/<machine class>.json")
    parser.add_argument("--budget", action="store_true",
                        help="profile the budget shapes' steps (phases, and against matmuls of their precision)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="--budget: the steps' precision (bf16 on a CPU with bf16 instructions)")
    args = parser.parse_args()
    if args.budget:
        return main_budget(args)
    preset, batch, rounds = ("debug", 8, 1) if args.smoke else ("production", 32, args.rounds)
    config = model_preset(preset, 119)
    peak = matmul_peak(2, SMOKE_PEAK_SHAPES) if args.smoke else matmul_peak(10)
    label = machine_label()
    print(f"{machine_kind(label)}: bf16 matmul peak {peak / 1e9:,.0f} GFLOP/s", flush=True)

    profiles = {p: profile(Setup(p, config, batch, p), 2 if args.smoke else 5) for p in ("fp32", "bf16")}
    for precision, prof in profiles.items():
        print(f"\n{preset} step, {precision}: {prof['ms_per_step']} ms (profiled, self CPU time)")
        for fam, v in prof["families"].items():
            print(f"  {fam:<34} {v['ms']:>8.1f} ms  {v['share']:>6.1%}")

    no_dropout = config.model_copy(update={"dropout": 0.0})
    setups = [Setup("bf16, as shipped (dropout 0.1, foreach AdamW)", config, batch, "bf16"),
              Setup("bf16, fused AdamW (CPU kernel)", config, batch, "bf16", fused_adamw=True,
                    changes_numerics="optimizer arithmetic order"),
              Setup("bf16, MLP compiled (torch.compile per block)", config, batch, "bf16", compile_mlp=True),
              Setup("bf16, no attention-weight dropout (residual dropout kept)", config, batch, "bf16",
                    attention_dropout=False, changes_numerics="less regularisation: attention weights not dropped"),
              Setup("bf16, dropout masks from torch.rand (residual, MLP, embedding)", config, batch, "bf16",
                    rand_masks=True, changes_numerics="another random stream for the masks"),
              Setup("bf16, dropout 0 (another model: reference only)", no_dropout, batch, "bf16",
                    changes_numerics="no dropout: a different model")]
    if args.smoke:
        setups = setups[:2]
    for s in setups:  # warm up (and compile) outside the timing
        for _ in range(2):
            s.step()
    times = {s.name: [] for s in setups}
    for _ in range(rounds):
        for s in setups:
            start = time.perf_counter()
            s.step()
            times[s.name].append(time.perf_counter() - start)
    per_token = flops_per_token(config, setups[0].model.num_parameters())
    base = statistics.median(times[setups[0].name])
    attempts = []
    print(f"\nattempts ({rounds} interleaved rounds, median step)")
    for s in setups:
        seconds = statistics.median(times[s.name])
        row = {"attempt": s.name, "tokens_per_sec": round(s.tokens / seconds, 1),
               "vs_shipped": round(base / seconds, 3),
               "mfu_bf16": round(s.tokens / seconds * per_token / peak, 3), "changes": s.changes,
               "machine": machine_kind(label)}
        attempts.append(row)
        print(f"  {s.name:<50} {row['tokens_per_sec']:>9,.0f} tok/s  {row['vs_shipped']:.2f}x  MFU "
              f"{row['mfu_bf16']:.1%}")
    args.out = output_path(args.out, "profile_step", args.smoke)
    write_result(args.out, {"machine": label, "preset": preset, "batch": batch, "bf16_peak_flops": peak,
                            "profiles": profiles, "attempts": attempts, "smoke": args.smoke})
    print(f"wrote {args.out}")


def main_budget(args) -> None:
    label = machine_label()
    shapes = ("small",) if args.smoke else ("small", "production")
    results = [budget_profile(shape, args.smoke, 2 if args.smoke else 2 * args.rounds + 1, args.precision)
               for shape in shapes]
    for result in results:
        print_budget(label, result)
    out = output_path(args.out, "profile_step_budget", args.smoke, "" if args.precision == "fp32" else args.precision)
    write_result(out, {"machine": label, "shapes": results, "smoke": args.smoke})
    print(f"wrote {out}")


def print_budget(label: dict, result: dict) -> None:
    precision = result["precision"]
    print(f"{machine_kind(label)}: budget shape {result['shape']}, {precision}, batch {result['batch']}, "
          f"{result['optimizer']}: {result['step_ms']} ms a step, {result['tokens_per_s']:,.0f} tokens/s, "
          f"{result['flops_per_s'] / 1e9:.1f} GFLOP/s")
    for products, flops in result[f"{precision}_matmul_flops_per_s"].items():
        print(f"  {precision} matmul at {products}: {flops / 1e9:.1f} GFLOP/s; the step runs at "
              f"{result[f'of_{precision}_matmul'][products]:.0%} of it")
    print(f"phases under the profiler ({result['profiled_step_ms']} ms a step):")
    for phase, ms in result["phase_ms"].items():
        print(f"  {phase:<38} {ms:>8.2f} ms")
    print("op families (self CPU time):")
    for fam, v in result["families"].items():
        print(f"  {fam:<38} {v['ms']:>8.1f} ms  {v['share']:>6.1%}")


if __name__ == "__main__":
    main()
