"""Each minigpt process gets cores / live minigpt processes threads, follows their number, and can be overridden."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO_ROOT
from minigpt.core import thread_share
from minigpt.core.errors import ConfigError
from minigpt.core.processes import process_start
from minigpt.core.stage import stage_main
from minigpt.core.thread_share import ThreadShare


@pytest.fixture
def alone(tmp_path, monkeypatch):
    """A private registry, no override, and torch's thread count restored afterwards."""
    monkeypatch.setenv(thread_share.REGISTRY_ENV, str(tmp_path / "workers"))
    monkeypatch.delenv(thread_share.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(thread_share, "available_cores", lambda: 4)
    before = torch.get_num_threads()
    yield tmp_path / "workers"
    torch.set_num_threads(before)


def test_the_share_follows_the_number_of_live_minigpt_processes(alone):
    with ThreadShare() as share:
        assert torch.get_num_threads() == 4
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            (alone / f"{other.pid}.pid").write_text(process_start(other.pid))
            assert thread_share.rebalance() == 2 and torch.get_num_threads() == 2
            (alone / f"{os.getppid()}.pid").write_text("1")  # a live pid with another start time: a reused pid
            assert thread_share.rebalance() == 2 and not (alone / f"{os.getppid()}.pid").exists()
        finally:
            other.kill()
            other.wait()
        assert thread_share.rebalance() == 4, "a finished process gives its cores back"
        assert not (alone / f"{other.pid}.pid").exists(), "dead entries are removed"
        assert share.entry.exists()
    assert not share.entry.exists()


def test_overrides_fix_the_count_or_are_refused_clearly(alone, monkeypatch):
    monkeypatch.setenv(thread_share.THREADS_ENV, "1")
    with ThreadShare():
        assert torch.get_num_threads() == 1
    monkeypatch.setenv(thread_share.THREADS_ENV, "two")
    with pytest.raises(ConfigError, match="MINIGPT_THREADS='two': must be a whole number of threads >= 1"):
        ThreadShare()
    monkeypatch.delenv(thread_share.THREADS_ENV)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(3)
    with ThreadShare():
        assert torch.get_num_threads() == 3, "an explicit OMP_NUM_THREADS is left alone"


def test_every_stage_registers_while_it_runs(alone, tmp_path):
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    seen = []

    def run(params):
        seen.append(sorted(p.name for p in alone.glob("*.pid")))

    assert stage_main("probe", run, ["--params", str(tmp_path / "params.yaml")]) == 0
    assert seen == [[f"{os.getpid()}.pid"]] and list(alone.glob("*.pid")) == []


def test_held_keeps_the_thread_count_while_the_share_changes_and_lets_go_after(alone):
    with ThreadShare():
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            (alone / f"{other.pid}.pid").write_text(process_start(other.pid))
            with thread_share.held():
                assert thread_share.rebalance() == 4 and torch.get_num_threads() == 4
                with thread_share.held():
                    pass
                assert thread_share.rebalance() == 4, "a nested hold that ends does not let go of the outer one"
            assert thread_share.rebalance() == 2 and torch.get_num_threads() == 2
        finally:
            other.kill()
            other.wait()
