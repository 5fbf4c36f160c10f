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

.PHONY: demo test lint size docs faults bench soak clean

# `set -o pipefail` in a recipe: a failed pip is a failed step, whatever its output went through.
SHELL := /bin/bash
# pip's output as one line, rewritten in place on a terminal: packages so far and the latest;
# then a one-line summary. Its warnings are kept in $(VENV)/pip.log, shown if pip fails.
PIP_PROGRESS := awk -v tty=$$([ -t 1 ] && echo 1) \
	'/^(Collecting|Obtaining) /{n++; if (tty) {printf "\r    %d packages: %-50.50s", n, $$2; fflush()}} \
	/^Successfully installed/{installed=NF-2} \
	END{printf "%s    %d packages checked, %d installed%-40s\n", tty ? "\r" : "", n, installed, ""}'

# The install says what it does, step by step, and pip's work shows as one line counting the
# packages it collects (its messages are shown only if it fails): a first run takes a minute.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "tasklease needs Python 3.11 or newer")'
	@echo "==> creating the virtual environment $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	@$(BIN)/python -m pip install --quiet --upgrade pip 2>$(VENV)/pip.log || { cat $(VENV)/pip.log; exit 1; }
	@echo "==> installing tasklease and its development tools into $(VENV)"
	@set -o pipefail; $(BIN)/python -m pip install --progress-bar off -e '.[dev]' 2>$(VENV)/pip.log \
		| $(PIP_PROGRESS) || { cat $(VENV)/pip.log; exit 1; }
	@rm -f $(VENV)/.installed-* && touch $@

$(NODE_STAMP): package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	rm -f node_modules/.installed-* && touch $@

demo: $(STAMP)
	@echo "==> running the demo"
	$(BIN)/tasklease demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd examples/userapp && MYPYPATH=../.. ../../$(BIN)/mypy --strict --explicit-package-bases myapp tests
	cd examples/fastapi_app && MYPYPATH=../.. ../../$(BIN)/mypy --strict --explicit-package-bases shop tests
	cd examples/django_app && MYPYPATH=../.. ../../$(BIN)/mypy --strict --explicit-package-bases shop tests
	@$(MAKE) --no-print-directory size

# Modules past SIZE_PROMPT lines, longest first: a prompt to look for a part that stands on its
# own, not a limit (it never fails; `make lint` ends with it).
SIZE_PROMPT := 800
size:
	@echo "==> modules over $(SIZE_PROMPT) lines (a prompt to look, not a limit):"
	@find tasklease -name '*.py' -exec wc -l {} + | awk -v cap=$(SIZE_PROMPT) '$$2 != "total" && $$1 > cap' \
		| sort -rn | { grep . || echo "    none"; }

# The documentation site, warnings as errors (a broken link or reference fails), into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The suite over TEST_WORKERS processes (pytest-xdist; one a core by default). Each starts the
# services its tests need (emulators, a Postgres cluster) on free ports of its own; the tests
# of one gcloud batch share a worker (tests/conftest.py). `$(BIN)/pytest` alone runs serially.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test: lint docs $(NODE_STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# The fault suite at full scale (tests/faults; `make test` runs it reduced), printing each
# scenario's counts. BENCHMARKS.md records one run.
faults: $(STAMP) $(NODE_STAMP)
	TASKLEASE_FAULTS=full $(BIN)/pytest tests/faults -m faults -s -q

bench: $(STAMP) $(NODE_STAMP)
	@command -v wrk >/dev/null || apt-get install -y wrk || (apt-get update && apt-get install -y wrk) \
		|| echo "warning: could not install wrk; bench.worker_throughput falls back to Python"
	$(BIN)/python bench/run_all.py

# The simulation soak: SOAK_LIFECYCLES seeded lifecycles on SQLite (seeds of 2,000 each, over
# one process more than cores, a progress bar on stderr), then a table of lifecycles x faults x
# stores and the violations, written into BENCHMARKS.md ("Simulation soak"). The full million
# took 2 h 18 min on this 2-core machine beside a test run (BENCHMARKS.md); SOAK_LIFECYCLES=20000
# is quick.
SOAK_LIFECYCLES ?= 1000000
soak: $(STAMP)
	$(BIN)/python -m bench.simulation_soak --lifecycles $(SOAK_LIFECYCLES) --per-seed 2000 \
		--stores sqlite

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache .tasklease site
