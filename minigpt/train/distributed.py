"""The distributed set-up of a training run, and the few values every rank must agree on.

Under `torchrun --nproc_per_node=N` (DDP: gloo on CPU, nccl on GPU) each rank is one process; without torchrun
everything here reduces to the single-process case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minigpt.model.devices import select_device


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_pref: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
    if use_cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Dist(rank, world, local)


def rank_device(pref: str, ddp: Dist) -> torch.device:
    device = select_device(pref)
    if device.type == "cuda" and ddp.world > 1:
        return torch.device("cuda", ddp.local_rank)
    return device


def barrier(ddp: Dist) -> None:
    if ddp.world > 1:
        dist.barrier()


def max_over_ranks(value: float, ddp: Dist, device: torch.device) -> float:
    """The largest of every rank's value (the value itself in a single process)."""
    if ddp.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)  # nccl reduces GPU tensors only
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def agreed_clock(elapsed_s: float, ddp: Dist, budget: float | None, device: torch.device) -> float:
    """The slowest rank's clock, so that under a time budget every rank applies the same LR and stops together."""
    return elapsed_s if budget is None else max_over_ranks(elapsed_s, ddp, device)


def any_rank(flag: bool, ddp: Dist, device: torch.device) -> bool:
    """Whether the flag is set on any rank (a signal may reach one rank only): all ranks act at the same step."""
    return max_over_ranks(1.0 if flag else 0.0, ddp, device) > 0


def gather_generator_states(generator: torch.Generator, ddp: Dist) -> list[torch.Tensor]:
    """Every rank's generator state (rank order), so a resumed run draws the same batches on every rank."""
    if ddp.world == 1:
        return [generator.get_state()]
    gathered = [None] * ddp.world
    dist.all_gather_object(gathered, generator.get_state())
    return gathered
