"""The shared entry point of every stage script: read params.yaml, run, report errors cleanly."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

from minigpt.core.config import DEFAULT_PARAMS, Params, load_params
from minigpt.core.errors import MinigptError
from minigpt.core.thread_share import ThreadShare


def stage_main(name: str, run: Callable[[Params], None], argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"stages/{name}.py", description=f"minigpt stage '{name}'")
    parser.add_argument("--params", default=DEFAULT_PARAMS, help="composed parameters (default: params.yaml)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        with ThreadShare():  # this process's share of the cores while other minigpt processes run
            run(load_params(args.params))
    except MinigptError as exc:
        code = getattr(exc, "exit_code", 1)  # a requested stop (Ctrl-C, SIGTERM) is not an error: 130 / 143
        print(f"[{name}] {'' if code != 1 else 'error: '}{exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"[{name}] interrupted (Ctrl-C); nothing was half-written (outputs are replaced "
              "atomically)", file=sys.stderr)
        return 130
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone reports
        print(f"[{name}] done in {time.perf_counter() - start:.2f}s")
    return 0


def read_text(path) -> str:
    """UTF-8 text exactly as stored (no newline translation)."""
    return open(path, "rb").read().decode("utf-8")
