"""The watchdog false-alarm benchmark runs the long presets in slices: each run is written as soon as it ends, a later
slice appends to the rows already written, and the summary counts every row with the machines they ran on."""

import json

import pytest

from minigpt.testing import false_alarm_rows as bench


def row(seed: int, machine: str, warnings: int = 0, val: float = 2.2) -> dict:
    return {"machine": machine, "preset": "budget-15m", "seed": seed, "preflight_passed": True, "failed": [],
            "warnings": warnings, "val_bpc": val, "test_bpc": val - 0.15, "vs_best_static_bpc": val - 2.246}


def test_a_later_slice_appends_and_the_summary_counts_every_row(tmp_path):
    out = tmp_path / "results.json"
    assert bench.earlier_rows(out) == []
    first = [row(1, "Xeon"), row(2, "Xeon", val=2.25)]
    bench.write_results(out, {"cpu": "Xeon"}, False, first)
    rows = bench.earlier_rows(out) + [row(3, "EPYC", warnings=2, val=2.19)]
    bench.write_results(out, {"cpu": "EPYC"}, False, rows)
    written = json.loads(out.read_text())
    assert [r["seed"] for r in written["rows"]] == [1, 2, 3]
    summary = written["summary"]["budget-15m"]
    assert summary["runs"] == 3 and summary["seeds"] == [1, 2, 3]
    assert summary["machines"] == ["EPYC", "Xeon"]
    assert summary["runs_with_warnings"] == 1 and summary["warnings"] == 2
    assert summary["val_bpc"] == [2.19, 2.25]
    # mean 2.2133, sd 0.0321; t(0.975, 2 df) = 4.303, so the mean's interval is ± 4.303 * 0.0321 / sqrt(3) = ± 0.0797
    val = summary["val_bpc_spread"]
    assert val["mean"] == pytest.approx(2.21333, abs=1e-5) and val["sd"] == pytest.approx(0.03215, abs=1e-5)
    assert val["mean_ci95"] == pytest.approx([2.21333 - 0.07986, 2.21333 + 0.07986], abs=2e-4)
    assert summary["test_bpc_spread"]["mean"] == pytest.approx(2.21333 - 0.15, abs=1e-5)
    assert list(tmp_path.iterdir()) == [out]  # written through a temp file, nothing left beside it


def test_stops_and_refusals_are_counted_apart_from_trained_runs():
    stopped = {**row(4, "Xeon"), "stopped": "train_diverging"}
    for key in ("warnings", "val_bpc", "vs_best_static_bpc"):
        stopped.pop(key)
    refused = {"machine": "Xeon", "preset": "budget-15m", "seed": 5, "preflight_passed": False,
               "failed": ["lr_stability"]}
    summary = bench.summarise([row(1, "Xeon"), stopped, refused])["budget-15m"]
    assert (summary["runs"], summary["stopped"], summary["refused"], summary["warnings"]) == (3, 1, 1, 0)
    assert summary["val_bpc"] == [2.2, 2.2]
    assert summary["val_bpc_spread"] is None, "one trained run has no spread"


def test_a_preset_that_builds_other_soft_targets_rebuilds_the_tokens_once():
    """The budget presets train on soft targets the default params do not build: their first run rebuilds them."""

    class Composed:
        def __init__(self, order: int):
            self.order = order

        def section_dict(self, name: str) -> dict:
            return {"order": self.order} if name == "soft_targets" else {"kind": "char"}

    built: dict = {}
    rebuilt = [bench.tokens_stale(Composed(order), built) for order in (0, 0, 7, 7, 7, 0)]
    assert rebuilt == [True, False, True, False, False, True]
