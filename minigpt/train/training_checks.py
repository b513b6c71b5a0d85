"""The guide's "during training" checklist, recorded in train_summary.json under "checks":
- validation_eval_mode: every validation loss is computed with no module in training mode, seen by a ModeProbe
  attached from outside the validation code (dropout on would make the logged val loss, and so the choice of the
  best checkpoint, not the model's);
- best_follows_val: the best checkpoint on disk holds the evaluation with the lowest validation loss in the run's
  log, read back from the file, not from the loop's own bookkeeping."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch.nn as nn

from minigpt.core.errors import MinigptError
from minigpt.model.checkpoint import load_checkpoint
from minigpt.model.mode_probe import ModeProbe

TRAINING_CHECKS = ("validation_eval_mode", "best_follows_val")


class TrainingCheckFailed(MinigptError):
    """A checklist item failed: the run's val losses or its best checkpoint are not what they claim to be."""


class TrainingChecks:
    def __init__(self, best_step: int, best_val_loss: float):
        # where a resumed run's log was lost, the checkpoint's best is the only earlier evaluation known
        self.prior = (best_step, best_val_loss)
        self.evaluations = 0
        self.modules_called = 0

    @contextmanager
    def validating(self, model: nn.Module, step: int):
        with ModeProbe(model) as probe:
            yield
        self.evaluations += 1
        self.modules_called += probe.calls
        if probe.in_training:
            shown = ", ".join(probe.in_training[:4]) + (" …" if len(probe.in_training) > 4 else "")
            raise TrainingCheckFailed(
                f"validation_eval_mode: at step {step}, {len(probe.in_training)} module(s) ran in training mode "
                f"while the validation loss was computed ({shown}): with dropout on, the logged val loss and the "
                "choice of the best checkpoint are not the model's. Compute it under model.eval() (as "
                "batch_loss.evaluate_model does) and never switch a module back to train() inside it.")

    def records(self, history: list[dict], best_path: Path) -> dict:
        """Both checks' records; raises TrainingCheckFailed when the best checkpoint is not the log's best."""
        eval_mode = {"passed": True, "evaluations": self.evaluations, "modules_called": self.modules_called}
        return {"validation_eval_mode": eval_mode, "best_follows_val": best_follows_val(history, best_path,
                                                                                       self.prior)}


def best_follows_val(history: list[dict], best_path: Path, prior: tuple[int, float]) -> dict:
    logged = {r["step"]: r["val_loss"] for r in history if "val_loss" in r}
    if math.isfinite(prior[1]) and prior[0] not in logged:
        logged[prior[0]] = round(prior[1], 6)
    if not logged:
        return {"passed": True, "evaluations": 0}
    lowest = min(logged.values())
    kept = load_checkpoint(best_path)
    # the log rounds to 6 decimals: any evaluation at the lowest logged value is a correct best
    record = {"passed": logged.get(kept["step"]) == lowest and round(kept["best_val_loss"], 6) == lowest,
              "evaluations": len(logged), "lowest_logged_val_loss": lowest,
              "lowest_at_steps": sorted(s for s, v in logged.items() if v == lowest),
              "checkpoint_step": kept["step"], "checkpoint_val_loss": kept["best_val_loss"]}
    if not record["passed"]:
        raise TrainingCheckFailed(
            f"best_follows_val: {best_path} holds step {kept['step']} (val loss {kept['best_val_loss']:.6f}) but the "
            f"run's log has its lowest val loss {lowest:.6f} at step {record['lowest_at_steps'][0]}: evaluate and "
            "generate would use a checkpoint that is not the best. The best checkpoint must be saved whenever the "
            "validation loss improves; rerun `dvc repro train` after fixing it.")
    return record
