"""The committed params.yaml with one key changed, validated: the one-line error it gets."""

import yaml

from helpers import REPO_ROOT
from minigpt.core.config import params_from_dict
from minigpt.core.errors import ConfigError


def refusal(section: str, key: str, value) -> str:
    """The ConfigError message for params.yaml with `section.key` set to `value` (fails if it is accepted)."""
    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    raw[section][key] = value
    try:
        params_from_dict(raw)
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"{section}.{key} = {value!r} was accepted")
