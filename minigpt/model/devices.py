"""Where the code runs and in what precision: the device (CUDA, then Apple MPS, then CPU, unless one is
configured) and the autocast context of a precision ("fp32" or "bf16")."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from minigpt.core.errors import ConfigError


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def select_device(preference: str = "auto") -> torch.device:
    if preference == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": mps_available()}
    if not available.get(preference, False):
        raise ConfigError(f"'train.device' = {preference!r} is not available on this machine; use auto or cpu.")
    return torch.device(preference)


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast on the device for precision "bf16"; plain fp32 otherwise."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()
