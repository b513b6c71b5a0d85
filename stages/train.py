"""Stage train: refuses to start unless preflight passed for exactly this data and config; then trains.

Also runs under torchrun:  torchrun --nproc_per_node=2 stages/train.py
"""

from pathlib import Path

from minigpt.core.stage import stage_main
from minigpt.train.loop import train


def run(params):
    train(params, Path("."))


if __name__ == "__main__":
    raise SystemExit(stage_main("train", run))
