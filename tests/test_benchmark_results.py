"""Every committed benchmark result names the machine it was measured on, so figures of two machines are never
mixed (a CPU model, or a GPU device, in the file itself)."""

import json
import subprocess

from helpers import REPO_ROOT


def machine_of(result: dict) -> str | None:
    label = result.get("machine") if isinstance(result.get("machine"), dict) else result
    return label.get("cpu") or label.get("device")


def test_every_committed_result_names_its_machine():
    listed = subprocess.run(["git", "ls-files", "benchmarks/*.json"], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    files = [REPO_ROOT / name for name in listed]
    assert files
    unlabelled = [str(f.relative_to(REPO_ROOT)) for f in files if not machine_of(json.loads(f.read_text()))]
    assert unlabelled == []


def test_a_result_without_a_machine_is_seen():
    assert machine_of({"machine": {"platform": "Linux", "threads": 2}}) is None
    assert machine_of({"runs": []}) is None
    assert machine_of({"machine": {"cpu": "AMD EPYC"}}) == "AMD EPYC"
