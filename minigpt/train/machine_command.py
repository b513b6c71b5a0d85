"""`make machine`: measure, once per machine, the choices the shipped presets leave to the machine, and write each as
a Hydra config the presets compose (conf/machine/<name>.yaml).

    python -m minigpt.train.machine_command            # what changed since the last measurement (else nothing)
    python -m minigpt.train.machine_command --force    # measure everything again
    python -m minigpt.train.machine_command --reset    # back to the unmeasured placeholders the project ships

Which files: every conf/machine/ option some preset selects (the default composition and each conf/experiment/
option), except `none`. For each, the preset is composed and:
- with budget.shapes listed (a budget preset), each shape is composed in (`shape=NAME`), its training step timed
  in the precision train.precision auto picks on this machine, and the tokens-per-parameter rule
  (minigpt.train.shape_choice) picks the shape; the file selects that shape and sets its precision;
- otherwise the file sets train.precision: fp32 or bf16, timed only where the machine does not already answer
  (bf16 emulated on a CPU without bf16 instructions: fp32, without timing).
The record in each file names the machine label and the digest of what was timed (minigpt.train.machine_choice),
and a file whose inputs are unchanged on this machine is kept as it is.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from minigpt.core.choice_text import how_chosen, number_text
from minigpt.core.config import Params, params_from_dict
from minigpt.core.io_utils import atomic_path, canonical_json_digest
from minigpt.model.devices import select_device
from minigpt.model.precision import without_timing
from minigpt.train.machine_choice import MACHINE_COMMAND, current_label, timed_config, timed_digest, timing_vocab
from minigpt.train.precision_choice import measure_training
from minigpt.train.shape_choice import ShapeTiming, describe, pick_shape, tokens_per_parameter

NO_CHOICE = "none"
HEADER = (f"# @package _global_\n# Written by `{MACHINE_COMMAND}` (minigpt.train.machine_command): the choice measured "
          "on the machine `machine.label`\n# names, for the configuration `machine.timed` digests. A run on another "
          f"machine or configuration refuses it;\n# rerun `{MACHINE_COMMAND}` there. Do not edit by hand "
          "(docs/data-and-config.md, \"Machine choices\").\n")


def compose(conf_dir: Path, overrides: list[str], with_choices: bool = False):
    """conf_dir/config.yaml composed with overrides, as DVC does: a plain dict (and Hydra's group choices)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=overrides, return_hydra_config=with_choices)
    if not with_choices:
        return OmegaConf.to_container(cfg, resolve=True), {}
    return None, {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items()}


def machine_files(conf_dir: Path) -> dict[str, list[str]]:
    """Each conf/machine/ option a preset selects -> the overrides that compose that preset."""
    presets = [[]] + [[f"experiment={p.stem}"] for p in sorted((conf_dir / "experiment").glob("*.yaml"))]
    files: dict[str, list[str]] = {}
    for overrides in presets:
        _, choices = compose(conf_dir, overrides, with_choices=True)
        name = choices.get("machine")
        if name and name != NO_CHOICE:
            files.setdefault(name, overrides)
    return files


def composed_params(conf_dir: Path, overrides: list[str]) -> Params:
    raw, _ = compose(conf_dir, overrides)
    return params_from_dict(raw, f"{conf_dir}/config.yaml composed with {' '.join(overrides) or 'no overrides'}")


class Timer:
    """Times each distinct training step once per command (presets share shapes)."""

    def __init__(self, say):
        self.say, self.cache, self.seconds = say, {}, 0.0

    def measure(self, params: Params, what: str) -> dict:
        key = canonical_json_digest({k: v for k, v in timed_config(params).items() if k != "budget"})
        if key not in self.cache:
            started = time.perf_counter()
            self.cache[key] = measure_training(params, timing_vocab(params), select_device(params.train.device))
            self.seconds += time.perf_counter() - started
            record = self.cache[key]
            self.say(f"[machine] {what}: {number_text(record['tokens_per_s'])} tokens/s in {record['choice']} "
                     f"({how_chosen(record)})")
        return self.cache[key]


def choose_shape(candidates: dict[str, Params], base: Params, timer: Timer) -> dict:
    """The shape the rule picks from this machine's timings of every candidate, with its precision."""
    measured = {name: timer.measure(p, f"shape {name}") for name, p in candidates.items()}
    seconds = base.train.max_seconds
    timings = [ShapeTiming(name, m["parameters"], m["tokens_per_s"]) for name, m in measured.items()]
    choice = pick_shape(timings, seconds, base.budget.min_tokens_per_parameter)
    shapes = {t.name: {"parameters": t.parameters, "tokens_per_s": t.tokens_per_s,
                       "precision": measured[t.name]["choice"],
                       "tokens_per_parameter": round(tokens_per_parameter(t, seconds), 3)} for t in timings}
    how = describe({"choice": choice, "budget_seconds": seconds, "shapes": shapes,
                    "min_tokens_per_parameter": base.budget.min_tokens_per_parameter})
    return {"shape": choice, "precision": measured[choice]["choice"], "tokens_per_s": measured[choice]["tokens_per_s"],
            "timed": timed_digest(candidates[choice]), "how": how}


def choose_precision(params: Params, timer: Timer) -> dict:
    """train.precision auto for this preset: fp32 where the machine answers without timing, else the faster."""
    fixed = without_timing("auto", select_device(params.train.device))
    if fixed is not None:
        return {"shape": None, "precision": fixed["choice"], "tokens_per_s": None, "timed": None,
                "how": how_chosen(fixed)}
    record = timer.measure(params, "precision auto")
    return {"shape": None, "precision": record["choice"], "tokens_per_s": record["tokens_per_s"],
            "timed": timed_digest(params), "how": how_chosen(record)}


def render(name: str, label: str | None, choice: dict, inputs: str) -> str:
    """The conf/machine/<name>.yaml text: the shape's selection, train.precision and the record."""
    body = {"train": {"precision": choice["precision"]},
            "machine": {"file": f"conf/machine/{name}.yaml", "label": label, "timed": choice["timed"],
                        "shape": choice["shape"], "precision": choice["precision"],
                        "tokens_per_s": choice["tokens_per_s"], "how": choice["how"]}}
    defaults = f"defaults:\n  - override /shape: {choice['shape']}\n  - _self_\n" if choice["shape"] else ""
    # what was measured (the label and every timed configuration): a later command keeps the file while it holds
    return HEADER + f"# inputs: {inputs}\n" + defaults + yaml.safe_dump(body, sort_keys=False, width=1000)


def stored_inputs(path: Path) -> str | None:
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# inputs: "):
            return line.removeprefix("# inputs: ").strip()
    return None


def measure_machine(conf_dir: Path = Path("conf"), force: bool = False, say=print) -> dict[str, str]:
    """Write every preset's conf/machine/ choice that is missing or stale; name -> "measured" or "kept"."""
    timer, outcome, label = Timer(say), {}, None
    for name, overrides in machine_files(conf_dir).items():
        overrides = [*overrides, f"machine={NO_CHOICE}"]
        base = composed_params(conf_dir, overrides)
        label = current_label(base)
        path = conf_dir / "machine" / f"{name}.yaml"
        candidates = {shape: composed_params(conf_dir, [*overrides, f"shape={shape}"]) for shape in base.budget.shapes}
        timed = {shape: timed_config(p) for shape, p in candidates.items()} if candidates else timed_config(base)
        inputs = canonical_json_digest([label, timed])[:16]
        if not force and stored_inputs(path) == inputs:
            outcome[name] = "kept"
            continue
        choice = choose_shape(candidates, base, timer) if candidates else choose_precision(base, timer)
        with atomic_path(path) as tmp:
            tmp.write_text(render(name, label, choice, inputs), encoding="utf-8")
        outcome[name] = "measured"
        say(f"[machine] {path}: {choice['precision']}, {choice['how']}")
    say(f"[machine] {', '.join(f'{n} {o}' for n, o in outcome.items()) or 'no preset leaves a choice to the machine'}; "
        f"{timer.seconds:.1f} s of timing on {label or 'this machine'}")
    return outcome


def reset_machine(conf_dir: Path = Path("conf"), say=print) -> None:
    """Write the unmeasured placeholder of every preset's conf/machine/ file (what the project ships): a run that
    uses one stops and names this command. It selects the first candidate shape and fp32, so presets compose."""
    for name, overrides in machine_files(conf_dir).items():
        base = composed_params(conf_dir, [*overrides, f"machine={NO_CHOICE}"])
        choice = {"shape": base.budget.shapes[0] if base.budget.shapes else None, "precision": "fp32",
                  "tokens_per_s": None, "timed": None, "how": f"not measured: run `{MACHINE_COMMAND}` on this machine"}
        path = conf_dir / "machine" / f"{name}.yaml"
        with atomic_path(path) as tmp:
            tmp.write_text(render(name, None, choice, "not measured"), encoding="utf-8")
        say(f"[machine] {path}: unmeasured")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="measure again even where nothing changed")
    parser.add_argument("--reset", action="store_true", help="write the unmeasured placeholders instead")
    parser.add_argument("--conf", type=Path, default=Path("conf"))
    args = parser.parse_args(argv)
    if args.reset:
        reset_machine(args.conf)
    else:
        measure_machine(args.conf, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
