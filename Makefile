# MANTA developer entry points. `make test` and `make demo` are all a newcomer needs.
#
# Environment: third-party dependencies live in a cached environment outside the clone,
# $(MANTA_CACHE_DIR)/deps-<key>, keyed by the hash of the declared dependencies, constraints.txt and
# the interpreter, so a fresh clone (CI) reuses the ~5 GB torch install instead of reinstalling it.
# The clone's own .venv is tiny: it sees the cached packages through a .pth file and holds only the
# editable install of MANTA itself (its console scripts point at this clone). It is rebuilt whenever
# the key changes; a cached environment is only used once it was completely built (marker file).

SHELL := /bin/bash
PYTHON ?= python3
MANTA_CACHE_DIR ?= $(HOME)/.cache/manta
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Console scripts (manta-peer, ...) are found by name from tests and from manta-swarm.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

DEPS_KEY := $(shell scripts/deps_key.sh "$(PYTHON)")
STAMP := $(VENV)/.manta-deps-$(DEPS_KEY)

.PHONY: test test-all test-swarm lint venv constraints clean

venv: $(STAMP)

$(STAMP):
	@MANTA_CACHE_DIR="$(MANTA_CACHE_DIR)" scripts/make_venv.sh "$(PYTHON)" "$(DEPS_KEY)" "$(VENV)"

# The default suite: everything but `slow` (benchmark-sized runs, browser tests).
test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# Everything, including `slow`.
test-all: venv
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

# Only the multi-process swarm tests.
test-swarm: venv
	$(PY) -m pytest -m swarm $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Re-pin constraints.txt from a fresh resolution of pyproject's ranges (run after changing them).
constraints:
	@scripts/make_constraints.sh "$(PYTHON)"

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
