# Two commands do all the set-up on a fresh clone:  `make repro` (the pipeline)  and  `make test`.
# Both create the virtual environment (.venv) with pinned versions when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.minigpt-installed
# put the venv first so DVC's `python stages/...` commands use it
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1

.PHONY: setup params machine repro test test-slow test-all lint results results-check clean-venv

# TORCH=cpu: torch (the version constraints.txt pins) from PyTorch's CPU-only wheel index, so no CUDA libraries
# are installed; the default takes torch from the indexes pip is configured with (PyPI: on Linux x86_64 the CUDA
# build with its nvidia-* wheels; a machine with a local CPU wheel configured gets that one)
TORCH ?= default
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_VERSION := $(shell sed -n 's/^torch==//p' constraints.txt)
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(TORCH),cpu)
	$(PIP) --index-url $(TORCH_CPU_INDEX) "torch==$(TORCH_VERSION)"
else ifneq ($(TORCH),default)
	$(error TORCH=$(TORCH): use TORCH=cpu (CPU-only wheel index) or leave it unset)
endif
	$(PIP) -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# recompose params.yaml from conf/ (what `dvc exp run` does; `dvc repro` only reads params.yaml)
params: $(STAMP)
	$(BIN)/python -m minigpt.core.compose $(OVERRIDES)

# measure what the presets leave to this machine (train.precision auto, the budget shapes) into conf/machine/ and
# recompose params.yaml; keeps what is already measured for this machine and configuration (FORCE=1: measure again)
machine: $(STAMP)
	$(BIN)/python -m minigpt.train.machine_command $(if $(FORCE),--force)
	$(BIN)/python -m minigpt.core.compose

# the whole pipeline; DATA=/abs/path uses a local copy (directory or zip) instead of downloading;
# OVERRIDES='experiment=debug ...' composes Hydra overrides in (each passed to dvc exp run as -S)
repro: machine
ifdef DATA
	$(BIN)/dvc exp run -S data=local -S data.path=$(abspath $(DATA)) $(addprefix -S ,$(OVERRIDES))
else ifdef OVERRIDES
	$(BIN)/dvc exp run $(addprefix -S ,$(OVERRIDES))
else
	$(BIN)/dvc repro
endif

# the default tier on one worker per core (pytest-xdist; each worker computes on one thread, tests/conftest.py),
# a test file per worker so its module fixtures are built once; JOBS=1 runs it in one process
JOBS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(JOBS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the results tables of README.md and docs/, regenerated from benchmarks/results/ (results-check: fail if one differs)
results: $(STAMP)
	$(BIN)/python -m benchmarks.tables

results-check: $(STAMP)
	$(BIN)/python -m benchmarks.tables --check

# ruff, configured in pyproject.toml (CI runs it)
lint: $(STAMP)
	$(BIN)/ruff check minigpt stages tests benchmarks

# remove the environment (e.g. before `make setup TORCH=cpu` on a machine that has one)
clean-venv:
	rm -rf $(VENV)
