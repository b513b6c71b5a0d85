"""How `precision: auto` decides, on this machine: the same work timed in fp32 and in bf16, interleaved so that
both see the same machine load, and the faster wins. Evaluation times its forward passes here; training times
its steps with the same rule (minigpt/train/precision_choice.py). An explicit fp32 or bf16 is used as configured.
"""

from __future__ import annotations

import time

import torch

from minigpt.core.machine import bf16_emulated, cpu_info
from minigpt.model import batch_loss

PRECISIONS = ("fp32", "bf16")
WARMUP_STEPS = 1  # per precision, untimed (first-call allocations, autocast caches)
TIMED_ROUNDS = 3  # rounds of one fp32 and one bf16 step, interleaved


def bf16_usable(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type in ("cpu", "mps")


def random_batch(vocab_size: int, batch: int, block: int, device: torch.device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, block + 1), generator=gen)
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved_seconds(run_once, device: torch.device, precisions: tuple[str, ...] = PRECISIONS) -> dict[str, float]:
    """Median seconds of `run_once(precision)` per precision, after a warmup, alternating them."""
    for precision in precisions:
        for _ in range(WARMUP_STEPS):
            run_once(precision)
    seconds = {p: [] for p in precisions}
    for _ in range(TIMED_ROUNDS):
        for precision in precisions:
            sync(device)
            start = time.perf_counter()
            run_once(precision)
            sync(device)
            seconds[precision].append(time.perf_counter() - start)
    return {p: sorted(s)[len(s) // 2] for p, s in seconds.items()}


def decide(configured: str, tokens: int, seconds: dict[str, float], spent: float, batch: list[int]) -> dict:
    rates = {p: tokens / s for p, s in seconds.items()}
    choice = max(rates, key=rates.get)
    return {"configured": configured, "choice": choice, "fp32_tokens_per_s": round(rates["fp32"], 1),
            "bf16_tokens_per_s": round(rates["bf16"], 1), "bf16_vs_fp32": round(rates["bf16"] / rates["fp32"], 3),
            "batch": batch, "timed_rounds": TIMED_ROUNDS, "seconds": round(spent, 2)}


def without_timing(configured: str, device: torch.device) -> dict | None:
    """The choice when nothing needs timing: an explicit precision, auto where bf16 cannot run, or auto on a CPU
    without bf16 instructions (bf16 emulated: fp32 wins there by an order of magnitude)."""
    if configured != "auto":
        return {"configured": configured, "choice": configured}
    if not bf16_usable(device):
        return {"configured": "auto", "choice": "fp32", "reason": f"bf16 is not supported on {device}"}
    if device.type == "cpu" and bf16_emulated(cpu_info()):
        return {"configured": "auto", "choice": "fp32",
                "reason": "this CPU has no bf16 instructions (neither avx512_bf16 nor amx_bf16), so bf16 is emulated "
                          "and far slower than fp32: fp32, without timing"}
    return None



def choose_evaluation_precision(model: torch.nn.Module, configured: str, batch_size: int, device: torch.device) -> dict:
    """The precision evaluation scores in: as configured, or (auto) the faster forward pass of this model."""
    fixed = without_timing(configured, device)
    if fixed is not None:
        return fixed
    started = time.perf_counter()
    batch = [batch_size, model.config.block_size]
    inputs, targets = random_batch(model.config.vocab_size, *batch, device, seed=0)

    def forward(precision: str) -> None:
        batch_loss.evaluate_model(model, [(inputs, targets)], precision)

    seconds = interleaved_seconds(forward, device)
    return decide("auto", batch[0] * batch[1], seconds, time.perf_counter() - started, batch)


