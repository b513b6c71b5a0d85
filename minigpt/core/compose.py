"""Compose conf/ into params.yaml exactly as `dvc exp run` does (hydra.enabled in .dvc/config).

    python -m minigpt.core.compose                       # conf/ defaults -> params.yaml
    python -m minigpt.core.compose experiment=debug      # with Hydra overrides
"""

from __future__ import annotations

import sys
from pathlib import Path

from minigpt.core.io_utils import atomic_path


def compose_params(output: str | Path, conf_dir: str | Path = "conf", overrides: list[str] | None = None) -> None:
    """Write the composition of conf_dir/config.yaml (+ overrides) to `output`, atomically."""
    from dvc.utils.hydra import compose_and_dump  # the very function `dvc exp run` calls

    conf_dir = Path(conf_dir).resolve()
    with atomic_path(output) as tmp:
        compose_and_dump(tmp.with_suffix(".yaml"), str(conf_dir), None, "config", str(conf_dir.parent),
                         list(overrides or []))
        tmp.with_suffix(".yaml").replace(tmp)


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    compose_params("params.yaml", "conf", overrides)
    print(f"params.yaml composed from conf/ {' '.join(overrides)}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
