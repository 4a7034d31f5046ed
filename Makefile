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
# The thin .venv also holds the editable install, whose console scripts and package list come from
# pyproject.toml: a change there rebuilds the .venv (seconds), not the cached dependencies.
PROJECT_KEY := $(shell sha256sum pyproject.toml | cut -c1-8)
STAMP := $(VENV)/.manta-deps-$(DEPS_KEY)-$(PROJECT_KEY)

.PHONY: demo test test-all test-swarm lint venv system-tools constraints clean

venv: $(STAMP)

# iptables for the emulated internet (testbed/wan), installed when missing and run as root.
system-tools:
	@scripts/system_tools.sh

$(STAMP):
	@MANTA_CACHE_DIR="$(MANTA_CACHE_DIR)" scripts/make_venv.sh "$(PYTHON)" "$(DEPS_KEY)" "$(VENV)" "$(STAMP)"

# The main job on built-in data: a local swarm (one aggregator, three peers on 127.0.0.1) trains a
# digits supernet for 30 rounds and writes a summary. DEMO_ARGS adds or overrides manta-swarm options.
DEMO_ARGS ?=
demo: venv
	$(VENV)/bin/manta-swarm --peers 3 --rounds 30 $(DEMO_ARGS)

# The default suite: everything but `slow` (benchmark-sized runs, browser tests), in two phases:
# the tests that share the machine on parallel workers (JOBS, default: up to 4 cores), then the swarm
# and `exclusive` tests one at a time (scripts/run_tests.sh says why).
test: venv system-tools
	@scripts/run_tests.sh $(PY) $(PYTEST_ARGS)

# Everything, including `slow`.
test-all: venv system-tools
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

# Only the multi-process swarm tests.
test-swarm: venv system-tools
	$(PY) -m pytest -m swarm $(PYTEST_ARGS)

# The aggregator's dashboard in a real headless Chromium during a local swarm run (a `slow` test);
# installs Debian's chromium first if it is missing. Screenshot: test-artifacts/monitor-dashboard.png.
.PHONY: test-browser
test-browser: venv
	@command -v chromium >/dev/null || { echo "manta: installing chromium (apt-get)"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -q chromium >/dev/null \
	  || { $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -q >/dev/null && \
	       $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -q chromium >/dev/null; }; }
	$(PY) -m pytest -m slow tests/aggregator/test_monitor_browser.py $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Re-pin constraints.txt from a fresh resolution of pyproject's ranges (run after changing them).
constraints:
	@scripts/make_constraints.sh "$(PYTHON)"

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
