"""The optimizers: the weight-decay split, AdamW, and Muon + AdamW (the LR schedule and what applies it live in
minigpt/train/train_step.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

from minigpt.train.muon import Muon


def build_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: matrix-shaped weights (linear, embedding) decay; biases and LayerNorm parameters do not.

    Only trainable parameters are included, each in exactly one group.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_adamw(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95), exclude=()) -> torch.optim.AdamW:
    """AdamW over build_param_groups' split; exclude: parameters another optimizer trains."""
    skip = {id(p) for p in exclude}
    groups = [{**g, "params": [p for p in g["params"] if id(p) not in skip]}
              for g in build_param_groups(model, weight_decay)]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    # the fused kernel (one launch for all parameters) where every parameter is on a CUDA device
    fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused or None)


def muon_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable matrices Muon trains: the model's hidden_matrices() (the blocks' linear weights)."""
    named = dict(model.named_parameters())
    return [named[name] for name in model.hidden_matrices() if named[name].requires_grad]


class MuonWithAdamW:
    """Muon for the hidden matrices and AdamW for every other parameter, used as one optimizer: one
    zero_grad/step, param_groups is both optimizers' groups (AdamW's first), one state dict.

    Muon's update is orthogonalised (Newton-Schulz) and scaled by 0.2 * sqrt(max(rows, cols)) ("match_rms_adamw"),
    so its updates have AdamW's RMS and both share the schedule's LR and train.weight_decay. The orthogonalisation
    runs in the training step's precision (orthogonalise_in; minigpt/train/muon.py says why).
    """

    def __init__(self, model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95)):
        matrices = muon_parameters(model)
        self.adamw = make_adamw(model, lr, weight_decay, betas, exclude=matrices)
        self.muon = Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.optimizers = (self.adamw, self.muon)
        self._pre_hooks = []

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def register_step_pre_hook(self, hook) -> None:
        """hook(self, args, kwargs) before either optimizer steps (torch.optim.Optimizer's signature)."""
        self._pre_hooks.append(hook)

    def step(self) -> None:
        for hook in self._pre_hooks:
            hook(self, (), {})
        for optimizer in self.optimizers:
            optimizer.step()

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"adamw", "muon"}:
            raise ValueError("not a Muon + AdamW optimizer state (written with train.optimizer=adamw?)")
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])


def orthogonalise_in(optimizer, precision: str) -> None:
    """Muon's next steps orthogonalise in the training step's precision (minigpt/train/muon.py); AdamW: nothing."""
    if isinstance(optimizer, MuonWithAdamW):
        optimizer.muon.precision = precision


def is_muon_group(group: dict) -> bool:
    return "ns_steps" in group  # only Muon's groups carry its Newton-Schulz settings


def make_optimizer(model: nn.Module, kind: str, lr: float, weight_decay: float, betas=(0.9, 0.95)):
    """train.optimizer: adamw -> AdamW over every parameter; muon -> MuonWithAdamW."""
    if kind == "muon":
        return MuonWithAdamW(model, lr, weight_decay, betas)
    return make_adamw(model, lr, weight_decay, betas)
