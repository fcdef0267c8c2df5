# The README's two commands: `make demo` (main job) and `make test` (the suite).
# Both set up .venv on a fresh machine first. Versions are pinned in requirements.txt only.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SHARED ?= $(abspath ../shared)

# Offline machines resolve the menagerie models, the Go2 experts and the official Go2 world
# model export from ../shared.
export MENAGERIE_ROOT ?= $(SHARED)/menagerie
export SIMDIST_GO2_EXPERTS ?= $(SHARED)/simdist_go2_experts
export SIMDIST_GO2_WORLD_MODEL ?= $(SHARED)/simdist_go2_world_model
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
export OMP_NUM_THREADS ?= 2

PYTEST_ARGS ?=

.PHONY: venv lint test test-all demo bench clean chromium

# pip byte-compiles every installed module: with PYTHONDONTWRITEBYTECODE=1 (set on these machines)
# a module left uncompiled is compiled again by every process that imports it (each node, each
# test worker), which costs the suite more than --no-compile saves at install.
$(STAMP): requirements.txt setup.py
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

# Style, the import contract and types (pyproject.toml): ruff lint + format check, import-linter,
# then mypy on src/ (its strictness: pyproject.toml [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# Two test processes (pytest-xdist), one test file each at a time: the ROS tests run on private
# domains (tests/conftest.py), so files never cross-talk; PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2

test: lint
	$(VPY) -m pytest -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The real-time soaks (marker `alone`) run after the rest in one process: a real-time graph
# holds its deadlines only with the cores to itself, not beside another test worker.
test-all: lint chromium
	$(VPY) -m pytest -m "not alone" -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	$(VPY) -m pytest -m alone -n 0 $(PYTEST_ARGS)

# Debian's headless Chromium for the web-viewer screenshot test (tests/test_viewer.py, slow;
# make test-all installs it first). Run as root (no sudo in the images).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

demo: $(STAMP)
	$(VPY) -m simdist_adapter.demo

bench: $(STAMP)
	for b in benchmarks/*.py; do $(VPY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
