"""One device check on a CUDA GPU: preflight, a short bf16 + torch.compile training through the real loop,
evaluate and generate on the GPU, the GPU checkpoint reloaded and resumed on the CPU, and training throughput /
MFU of the model variants against a bf16 matmul peak measured in the same run.

    python benchmarks/gpu_check.py --root <project with params.yaml, data/clean, data/tokenizer, data/encoded> --out DIR

Needs only torch, numpy, pyyaml, matplotlib and tqdm (no DVC/Hydra), so it runs on a bare CUDA image.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bench_common import flops_per_token
from minigpt.core.config import load_params
from minigpt.evaluate.checkpoint_eval import evaluate_checkpoint
from minigpt.evaluate.generation import generate_samples
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.preflight.checks import format_table
from minigpt.preflight.suite import run_preflight
from minigpt.train import train_step
from minigpt.train.loop import train
from minigpt.train.optim import make_adamw


def with_train(params, **changes):
    return params.model_copy(update={"train": params.train.model_copy(update=changes)})


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_peak_tflops(device: str, n: int, repeats: int = 10) -> float:
    """Median bf16 matrix-product rate on random data (host clock around a synchronised product)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def throughput(config: MiniGPTConfig, device: str, batch: int, precision: str, compile_model: bool,
               steps: int) -> float:
    torch.manual_seed(0)
    model = MiniGPT(config).to(device).train()
    optimizer = make_adamw(model, 1e-3, 0.1)
    run = torch.compile(model) if compile_model else model
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), device=device)
    y = torch.randint(0, config.vocab_size, (batch, config.block_size), device=device)

    def step():  # the project's training step
        train_step.training_step(run, optimizer, x, y, 1e-3, precision, 1.0, model.parameters())

    for _ in range(5):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return batch * config.block_size * steps / (time.perf_counter() - start)


def continue_on_cpu(path: Path, params, steps: int = 3) -> dict:
    """Load the GPU checkpoint on the CPU as resume does (strict model load, optimizer state onto the CPU
    parameters) and take a few optimizer steps there."""
    from minigpt.data.batching import get_batch
    from minigpt.data.encode import load_split
    from minigpt.model.checkpoint import load_checkpoint, load_state_strict

    checkpoint = load_checkpoint(path)
    model = MiniGPT(MiniGPTConfig(**checkpoint["config"]))
    load_state_strict(model, checkpoint, path)
    optimizer = train_step.make_optimizer(model, params.train)  # the run's optimizer (AdamW or Muon + AdamW)
    optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    devices = {str(v.device) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)}
    data = load_split(path.parents[1] / "data/encoded", "train")
    losses = []
    for step in range(checkpoint["step"] + 1, checkpoint["step"] + steps + 1):
        result = train_step.training_step(model, optimizer, *get_batch(data, 8, model.config.block_size),
                                          train_step.scheduled_lr(params.train, step), "fp32", params.train.grad_clip)
        losses.append(round(result.loss, 4))
    return {"from_step": checkpoint["step"], "optimizer_state_devices": sorted(devices), "cpu_losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of this script")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (dry runs)")
    parser.add_argument("--matmul", type=int, default=8192, help="size of the peak-rate matrix product")
    parser.add_argument("--timed-steps", type=int, default=30)
    args = parser.parse_args()
    root, out, device = args.root.resolve(), args.out, args.device
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    result = {"torch": torch.__version__, "device": name}
    print(f"torch {torch.__version__} on {name}", flush=True)

    result["bf16_matmul_peak_tflops"] = peak = matmul_peak_tflops(device, args.matmul)
    print(f"bf16 matmul peak ({args.matmul}^3, median of 10): {peak:.2f} TFLOP/s", flush=True)

    params = with_train(load_params(root / "params.yaml"), device=device, precision="bf16",
                        compile=not args.no_compile, max_steps=args.steps, eval_every=100, sample_length=100)
    report = run_preflight(params, root)
    print(format_table(report["checks"]), flush=True)
    result["preflight"] = {"passed": report["passed"], "seconds": report["seconds"], "failed": report["failed"]}

    start = time.perf_counter()
    summary = train(params, root)
    result["train"] = {**summary, "wall_s": time.perf_counter() - start}

    gpu_metrics = evaluate_checkpoint(params, root)
    cpu_metrics = evaluate_checkpoint(with_train(params, device="cpu"), root)
    result["evaluate"] = {"cuda_val_bpc": gpu_metrics["val"]["bpc"], "cpu_val_bpc": cpu_metrics["val"]["bpc"],
                          "test_bpc": gpu_metrics["test"]["bpc"]}
    generation, _ = generate_samples(params, root)
    result["generate"] = generation["mean"]
    print(f"[gpu_check] sample: {generation['samples'][0]['text'][:120]!r}", flush=True)

    try:
        result["cpu_resume"] = continue_on_cpu(root / "models/mini_gpt_latest.pt", params)
    except Exception as exc:  # report it, do not hide the other results
        result["cpu_resume"] = {"error": f"{type(exc).__name__}: {exc}"}

    config = MiniGPTConfig.from_params(params.model, 119)
    n_params = MiniGPT(config).num_parameters()
    fpt = flops_per_token(config, n_params)
    rows = []
    variants = [("fp32 eager", 256, "fp32", False), ("bf16 eager", 256, "bf16", False),
                ("bf16 compile", 256, "bf16", True), ("bf16 compile", 1024, "bf16", True)]
    for label, batch, precision, compiled in variants:
        if compiled and args.no_compile:
            continue
        rate = throughput(config, device, batch, precision, compiled, args.timed_steps)
        print(f"[gpu_check] {label} batch {batch}: {rate:,.0f} tokens/s", flush=True)
        rows.append({"variant": label, "batch": batch, "tokens_per_sec": rate,
                     "mfu_vs_bf16_peak": rate * fpt / (peak * 1e12)})
    result["throughput"] = {"parameters": n_params, "flops_per_token": fpt, "rows": rows}

    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"\npreflight passed: {report['passed']} ({report['seconds']['total']:.1f}s); "
          f"train {summary['steps']} steps: best val {summary['best_val_loss']:.4f}, "
          f"{summary['tokens_per_sec_median']:.0f} tok/s (batch {params.train.batch_size})")
    print(f"val bpc cuda {result['evaluate']['cuda_val_bpc']:.4f} / cpu {result['evaluate']['cpu_val_bpc']:.4f}; "
          f"cpu resume: {result['cpu_resume']}")
    print(f"{'variant':<14} {'batch':>6} {'tokens/s':>12} {'MFU':>7}")
    for r in rows:
        print(f"{r['variant']:<14} {r['batch']:>6} {r['tokens_per_sec']:>12,.0f} {r['mfu_vs_bf16_peak']:>7.2%}")


if __name__ == "__main__":
    main()
