"""A run's machine-dependent values, checked against this machine before any work.

`make machine` (minigpt.train.machine_command) measures, once per machine, what `train.precision: auto` and a budget
preset's shape should be, and writes the choice to conf/machine/<file>.yaml, which the presets compose: params.yaml
then holds the chosen values themselves (train.precision, the shape's model and train keys) plus the `machine`
record of where they came from. Nothing is timed or rewritten at run time; instead every stage that trains or
vouches for training calls `verify_machine_choice`, which refuses, in one line naming the command to run,

- `train.precision: auto` that is still auto (no choice composed);
- a choice in use that was not measured (the shipped placeholder) or was measured on another machine (its label);
- a choice in use that was timed for another configuration (the digest of what was timed, `timed_digest`).

A choice is in use while the params carry it: a budget preset's while its shape is the one composed (`-S
shape=NAME` forces another), another preset's while train.precision is the chosen one; an explicit `-S` that
replaces it leaves it unused, and nothing of it is checked.
"""

from __future__ import annotations

import torch

from minigpt.core.config import MachineConfig, Params
from minigpt.core.errors import ConfigError
from minigpt.core.io_utils import canonical_json_digest
from minigpt.core.machine import machine_label

MACHINE_COMMAND = "make machine"
# a character tokenizer's vocabulary is known only once clean train exists; the timing's output layer uses this
# size (a few hundred characters either way: a small share of the step)
CHAR_TIMING_VOCAB = 256
# the train keys that decide a training step's cost (the model section decides the rest)
TIMED_TRAIN_KEYS = ("batch_size", "optimizer", "device")


class MachineChoiceError(ConfigError):
    """The run's machine-dependent values were not measured for this machine or this configuration."""


def timing_vocab(params: Params) -> int:
    return params.tokenizer.vocab_size or CHAR_TIMING_VOCAB


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def current_label(params: Params) -> str:
    from minigpt.model.devices import select_device

    return machine_label(device_name(select_device(params.train.device)))


def timed_config(params: Params) -> dict:
    """What a timing of this run's training step depends on: the model, the batch, the optimizer, the device, the
    vocabulary; for a budget preset also what its shape was chosen by (the candidates, the clock, the rule)."""
    config = {"model": params.section_dict("model"),
              "train": {key: getattr(params.train, key) for key in TIMED_TRAIN_KEYS},
              "vocab": timing_vocab(params)}
    if params.budget.shapes:
        config["budget"] = {"shapes": list(params.budget.shapes), "seconds": params.train.max_seconds,
                            "min_tokens_per_parameter": params.budget.min_tokens_per_parameter}
    return config


def timed_digest(params: Params) -> str:
    return canonical_json_digest(timed_config(params))[:16]


def choice_in_use(params: Params) -> MachineConfig | None:
    """The composed machine record if the run uses its choice, else None: a budget preset's choice while its shape
    is the one composed (-S shape=NAME forces another), otherwise while train.precision is the chosen one."""
    record = params.machine
    if record is None:
        return None
    if record.shape is not None:
        return record if params.shape == record.shape else None
    return record if params.train.precision == record.precision else None


FIX = (f"run `{MACHINE_COMMAND}` to measure it here (or choose yourself: -S machine=none -S train.precision=fp32|bf16, "
       "plus -S shape=NAME for a budget preset)")


def require_resolved_precision(params: Params, source: str = "params.yaml") -> None:
    """Refuse `train.precision: auto` that no machine choice resolved."""
    if params.train.precision == "auto":
        raise MachineChoiceError(f"{source}: 'train.precision' is auto but no choice measured on this machine is "
                                 f"composed (machine: null); run `{MACHINE_COMMAND}` and recompose (`make params` or "
                                 "`dvc exp run`), or set -S train.precision=fp32|bf16.")


def verify_machine_choice(params: Params, source: str = "params.yaml") -> MachineConfig | None:
    """The machine choice this run uses, proven to be this machine's and this configuration's; None when it uses
    none. Raises MachineChoiceError (one line) otherwise."""
    require_resolved_precision(params, source)
    record = choice_in_use(params)
    if record is None:
        return None
    if record.label is None:
        raise MachineChoiceError(f"{record.file}: no choice has been measured on this machine yet; {FIX}.")
    here = current_label(params)
    if record.label != here:
        raise MachineChoiceError(f"{record.file}: measured on another machine ({record.label}; this one is {here}); "
                                 f"{FIX}.")
    if record.timed is not None and record.timed != timed_digest(params):
        raise MachineChoiceError(f"{record.file}: timed for another configuration than this run's (model, batch, "
                                 f"optimizer, device, vocabulary or budget differ); if conf/ changed, {FIX}.")
    return record
