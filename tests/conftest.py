import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N` (make test): each worker and every process it starts computes on one thread, so N workers on N
    # cores do not spin against each other (two processes using every core slow each other several-fold)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MINIGPT_THREADS"] = "1"

from minigpt.testing.wikitext_fixture import make_texts, release_for, write_directory, write_zip


@pytest.fixture(autouse=True)
def private_worker_registry(monkeypatch, tmp_path_factory):
    """Each test's minigpt processes share the cores among themselves only: the default registry is one folder per
    user, so a minigpt process elsewhere on the machine (another checkout's tests, a benchmark, a process left by an
    earlier test) would change a trainer's thread count, and with it the last bits of its sums. (The session-scoped
    project fixtures are built before any function fixture, so their stages still use the default registry.)"""
    from minigpt.core.thread_share import REGISTRY_ENV

    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path_factory.mktemp("workers")))


@pytest.fixture(scope="session")
def fixture_texts():
    return make_texts()


@pytest.fixture
def fixture_files(fixture_texts):
    return {name: text.encode("utf-8") for name, text in fixture_texts.items()}


@pytest.fixture
def fixture_dir(tmp_path, fixture_texts):
    return write_directory(tmp_path / "wikitext-src", fixture_texts)


@pytest.fixture
def fixture_zip(tmp_path, fixture_files):
    return write_zip(tmp_path / "zips" / "wikitext-2-raw-v1.zip", fixture_files)


@pytest.fixture
def fixture_release(fixture_zip, fixture_files):
    return release_for(fixture_zip, fixture_files)


@pytest.fixture(scope="session")
def encoded_project(tmp_path_factory, fixture_texts):
    """A debug-scale project with fetch..encode and baselines done on the fixture corpus (built once per session)."""
    from helpers.pipeline_fixture import build_project

    base = tmp_path_factory.mktemp("encoded")
    source = write_directory(base / "src", fixture_texts)
    return build_project(base / "project", source), source


@pytest.fixture
def project(encoded_project, tmp_path):
    """A private copy of the encoded project, free to break."""
    from helpers.pipeline_fixture import copy_project

    root, source = encoded_project
    return copy_project(root, tmp_path / "project"), source
