# Two entry points, both self-installing: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Reinstall whenever pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

# The Firestore tests start Google's emulator (gcloud's google-cloud-cli-firestore-emulator,
# Java 17+; required when CI=true). The npm emulator is only the local fallback when it is missing.
# The Spanner tests start Google's Spanner emulator (gcloud's native cloud-spanner-emulator
# component, package google-cloud-cli-spanner-emulator; required when CI=true).
NODE_STAMP := node_modules/.installed-$(shell cksum package-lock.json | cut -d' ' -f1)

.PHONY: demo test lint faults bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "tasklease needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

$(NODE_STAMP): package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	rm -f node_modules/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/tasklease demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd examples/userapp && MYPYPATH=../.. ../../$(BIN)/mypy --strict --explicit-package-bases myapp tests

test: lint $(NODE_STAMP)
	$(BIN)/pytest

# The fault suite at full scale (tests/faults; `make test` runs it reduced), printing each
# scenario's counts. BENCHMARKS.md records one run.
faults: $(STAMP) $(NODE_STAMP)
	TASKLEASE_FAULTS=full $(BIN)/pytest tests/faults -m faults -s -q

bench: $(STAMP) $(NODE_STAMP)
	@command -v wrk >/dev/null || apt-get install -y wrk || (apt-get update && apt-get install -y wrk) \
		|| echo "warning: could not install wrk; bench.worker_throughput falls back to Python"
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache .tasklease
