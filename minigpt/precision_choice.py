"""`precision: auto`: measure on this machine which precision runs the configured model faster, and use it.

bf16 autocast is about twice as fast as fp32 on a CPU with AMX, and slower than fp32 on small models of a CPU
without it; the same preset cannot be right for both. So preflight times a few real training steps (the shared
training step, the run's optimizer, the configured model and batch) in fp32 and in bf16, interleaved so that both
see the same machine load, and picks the faster; the report records both figures and the choice, the gate binds
the choice, and train uses exactly it. Evaluation does the same with its forward passes. An explicit fp32 or
bf16 is used as configured, without timing.
"""

from __future__ import annotations

import time

import torch

from minigpt import eval_loop, train_step
from minigpt.config import Params
from minigpt.model import MiniGPT, MiniGPTConfig

PRECISIONS = ("fp32", "bf16")
WARMUP_STEPS = 1  # per precision, untimed (first-call allocations, autocast caches)
TIMED_ROUNDS = 3  # rounds of one fp32 and one bf16 step, interleaved


def bf16_usable(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type in ("cpu", "mps")


def _random_batch(vocab_size: int, batch: int, block: int, device: torch.device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, block + 1), generator=gen)
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _interleaved(run_once, device: torch.device, precisions: tuple[str, ...] = PRECISIONS) -> dict[str, float]:
    """Median seconds of `run_once(precision)` per precision, after a warmup, alternating them."""
    for precision in precisions:
        for _ in range(WARMUP_STEPS):
            run_once(precision)
    seconds = {p: [] for p in precisions}
    for _ in range(TIMED_ROUNDS):
        for precision in precisions:
            _sync(device)
            start = time.perf_counter()
            run_once(precision)
            _sync(device)
            seconds[precision].append(time.perf_counter() - start)
    return {p: sorted(s)[len(s) // 2] for p, s in seconds.items()}


def _decide(configured: str, tokens: int, seconds: dict[str, float], spent: float, batch: list[int]) -> dict:
    rates = {p: tokens / s for p, s in seconds.items()}
    choice = max(rates, key=rates.get)
    return {"configured": configured, "choice": choice, "fp32_tokens_per_s": round(rates["fp32"], 1),
            "bf16_tokens_per_s": round(rates["bf16"], 1), "bf16_vs_fp32": round(rates["bf16"] / rates["fp32"], 3),
            "batch": batch, "timed_rounds": TIMED_ROUNDS, "seconds": round(spent, 2)}


def _without_timing(configured: str, device: torch.device) -> dict | None:
    """The choice when nothing needs timing: an explicit precision, or auto where bf16 cannot run."""
    if configured != "auto":
        return {"configured": configured, "choice": configured}
    if not bf16_usable(device):
        return {"configured": "auto", "choice": "fp32", "reason": f"bf16 is not supported on {device}"}
    return None


def _time_training_steps(params: Params, vocab_size: int, device: torch.device,
                         precisions: tuple[str, ...]) -> tuple[dict[str, float], int, list[int]]:
    """Median seconds of one training step per precision (the run's step, optimizer, model and batch), the
    model's parameter count and the batch shape."""
    config = MiniGPTConfig.from_params(params.model, vocab_size)
    torch.manual_seed(0)
    model = MiniGPT(config).to(device)
    optimizer = train_step.make_optimizer(model, params.train)
    batch = [params.train.batch_size, config.block_size]
    inputs, targets = _random_batch(vocab_size, *batch, device, seed=0)

    def step(precision: str) -> None:
        train_step.training_step(model, optimizer, inputs, targets, params.train.lr, precision, params.train.grad_clip)

    return _interleaved(step, device, precisions), sum(p.numel() for p in model.parameters()), batch


def measure_training(params: Params, vocab_size: int, device: torch.device) -> dict:
    """How the run's precision is chosen, always timed (a fixed precision alone; under auto both, and the faster
    wins), plus the chosen precision's training tokens/s and the model's parameter count (what a budget shape is
    chosen by)."""
    started = time.perf_counter()
    fixed = _without_timing(params.train.precision, device)
    precisions = (fixed["choice"],) if fixed is not None else PRECISIONS
    seconds, parameters, batch = _time_training_steps(params, vocab_size, device, precisions)
    spent = time.perf_counter() - started
    if fixed is None:
        record = _decide("auto", batch[0] * batch[1], seconds, spent, batch)
    else:
        record = {**fixed, "batch": batch, "timed_rounds": TIMED_ROUNDS, "seconds": round(spent, 2)}
    record["tokens_per_s"] = round(batch[0] * batch[1] / seconds[record["choice"]], 1)
    record["parameters"] = parameters
    return record


def choose_training_precision(params: Params, vocab_size: int, device: torch.device) -> dict:
    """The precision the run trains in, and how it was chosen (both timings when train.precision is auto; an
    explicit precision, or auto where bf16 cannot run, without timing)."""
    return _without_timing(params.train.precision, device) or measure_training(params, vocab_size, device)


def choose_evaluation_precision(model: torch.nn.Module, configured: str, batch_size: int, device: torch.device) -> dict:
    """The precision evaluation scores in: as configured, or (auto) the faster forward pass of this model."""
    fixed = _without_timing(configured, device)
    if fixed is not None:
        return fixed
    started = time.perf_counter()
    batch = [batch_size, model.config.block_size]
    inputs, targets = _random_batch(model.config.vocab_size, *batch, device, seed=0)

    def forward(precision: str) -> None:
        eval_loop.evaluate_model(model, [(inputs, targets)], precision)

    seconds = _interleaved(forward, device)
    return _decide("auto", batch[0] * batch[1], seconds, time.perf_counter() - started, batch)
