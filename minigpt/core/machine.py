"""What this CPU is: its model name, family/model numbers and the instruction-set flags that decide bf16 speed,
read from Linux's /proc/cpuinfo (empty where it cannot be read), and what they tell without timing anything."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# the flags that decide how fast bf16 runs, in the order a machine label lists them
ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
BF16_INSTRUCTIONS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class CpuInfo:
    name: str
    family_model: str  # "family/model" (x86), "?/?" where unknown: one name ("AMD EPYC") covers several generations
    flags: frozenset[str]


def cpu_info(path: Path = CPUINFO) -> CpuInfo:
    name, flags, ids = platform.processor() or platform.machine(), frozenset(), {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key == "flags" and not flags:
                flags = frozenset(value.split())
            elif key in ("cpu family", "model"):
                ids.setdefault(key, value.strip())
    except OSError:
        pass
    return CpuInfo(name, f"{ids.get('cpu family', '?')}/{ids.get('model', '?')}", flags)


def isa(info: CpuInfo) -> list[str]:
    return [flag for flag in ISA_FLAGS if flag in info.flags]


def bf16_emulated(info: CpuInfo) -> bool:
    """An x86 CPU (its flags are known: sse2 is in every one) without bf16 instructions: torch emulates bf16 there,
    about 16x slower than fp32 in a training step (docs/data-and-config.md, "precision: auto"), so there is nothing
    to time. Elsewhere (ARM, unknown flags) this says False and the timing decides."""
    return "sse2" in info.flags and not any(flag in info.flags for flag in BF16_INSTRUCTIONS)


def machine_label(device: str = "cpu") -> str:
    """What a measured choice is keyed by: the CPU (model name, family/model, the bf16-deciding ISA flags), its
    cores and torch's threads, the torch version and the device the run trains on. Any change re-measures."""
    import os

    import torch

    info = cpu_info()
    flags = "+".join(isa(info)) or "no listed ISA"
    return (f"{info.name} ({info.family_model}; {flags}), {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
            f"torch {torch.__version__}, {device}")
