"""The train stage: the one training step with its optimizer and LR schedule, the loop around it (gate, resume,
checkpoints, watchdogs, run log, stopping), the distributed set-up and the budget-shape and precision choices."""
