"""The budget-shape rule: which shape (conf/shape/) a time-budgeted preset trains on this machine.

Which shape wins a fixed wall clock depends on the machine: a bigger model learns more per token but trains fewer
tokens per second, and how many fewer depends on the CPU (bf16 is 2x fp32 with AMX and slower than fp32 on
small models without it). So `make machine` (minigpt.train.machine_command) times each candidate shape's training
step here (in the precision train.precision auto picks), and the rule below picks:

    the largest shape (by parameters) that sees at least min_tokens_per_parameter tokens per parameter
    in train.max_seconds at the measured tokens/s; if none does, the smallest.

Its threshold (budget.min_tokens_per_parameter) and the runs that set it: docs/decisions.md, "Budget shapes picked
per machine".
"""

from __future__ import annotations

from dataclasses import dataclass

from minigpt.core.choice_text import number_text


@dataclass(frozen=True)
class ShapeTiming:
    name: str
    parameters: int
    tokens_per_s: float


def tokens_per_parameter(shape: ShapeTiming, budget_s: float) -> float:
    return shape.tokens_per_s * budget_s / shape.parameters


def pick_shape(shapes: list[ShapeTiming], budget_s: float, min_tokens_per_parameter: float) -> str:
    """The rule: the largest shape that trains on >= min_tokens_per_parameter tokens per parameter in the budget,
    else the smallest. Ties in size go to the faster shape."""
    if not shapes:
        raise ValueError("no shapes to choose from")
    by_size = sorted(shapes, key=lambda s: (s.parameters, -s.tokens_per_s))
    fitting = [s for s in by_size if tokens_per_parameter(s, budget_s) >= min_tokens_per_parameter]
    return (fitting[-1] if fitting else by_size[0]).name


def describe(record: dict) -> str:
    """One line: every shape's measured tokens/s and tokens per parameter, and the choice (the console and the run
    page; a field missing from an old report reads "?")."""
    parts = [f"{name} {number_text(s.get('parameters'))} parameters at {number_text(s.get('tokens_per_s'))} tokens/s "
             f"({s.get('precision')}) = {number_text(s.get('tokens_per_parameter'), '.2f')} tokens/parameter"
             for name, s in (record.get("shapes") or {}).items()]
    budget = number_text(record.get("budget_seconds"), "g")
    return (f"{record.get('choice')} (in {budget} s: {'; '.join(parts)}; rule: the largest with >= "
            f"{number_text(record.get('min_tokens_per_parameter'), 'g')}, else the smallest)")
