# jobkeeper developer commands. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.DEFAULT_GOAL := help

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# Bytecode for src/ (an editable install): with PYTHONDONTWRITEBYTECODE set,
	@# every worker process the tests start would compile the package again.
	$(BIN)/python -m compileall -q src
	touch $@

.PHONY: help install pgbouncer chromium demo test test-django6 test-python lint format typecheck docs check bench soak clean

help: ## List the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv and install jobkeeper with its dev tools

demo: install ## Run the demo on the embedded SQLite default (no server needed)
	$(BIN)/jobkeeper demo

# tests/pgbouncer runs Debian's pgbouncer and fails (never skips) without it.
# As root it is installed when missing (and the service Debian may start on
# port 6432 is stopped: the tests run their own); otherwise we say how.
pgbouncer: ## Install Debian's pgbouncer (tests/pgbouncer needs it) when missing, as root
	@if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing pgbouncer (tests/pgbouncer needs it)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q pgbouncer >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null && apt-get install -y -q pgbouncer >/dev/null; }; \
		systemctl disable --now pgbouncer >/dev/null 2>&1 || service pgbouncer stop >/dev/null 2>&1 || true; \
	else \
		echo "pgbouncer is missing, so tests/pgbouncer will fail: install it with 'sudo apt-get install -y pgbouncer'"; \
	fi

# tests/browser drives Debian's Chromium with Playwright (browsers cannot be
# downloaded by `playwright install` here, and need not be): as root it is
# installed when missing, as pgbouncer is; otherwise we say how.
chromium: ## Install Debian's chromium (tests/browser needs it) when missing, as root
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (tests/browser needs it)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q chromium >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	else \
		echo "chromium is missing, so tests/browser will fail: install it with 'sudo apt-get install -y chromium'"; \
	fi

# Three test processes on two cores: most tests wait (on worker processes,
# heartbeats, rescue windows) rather than compute; the files stay whole per process.
test: install pgbouncer chromium ## Run the whole test suite (SQLite, and PostgreSQL at JOBKEEPER_TEST_PG_URL), Django 6 included
	$(BIN)/pytest -n 3 --dist loadfile --durations=15
	$(MAKE) --no-print-directory test-django6

# Django >= 6.0 (django.tasks built in) needs Python >= 3.12: its own venv,
# made with the first Python >= 3.12 found (PYTHON312=..., pyenv's 3.12.*,
# python3.12 on PATH), runs tests/contrib_django there. `make test` runs it after the main
# suite, which covers Django 5.2 with the django-tasks backport on the main venv's Python.
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python) $(shell command -v python3.12 2>/dev/null))
test-django6: ## tests/contrib_django on Django >= 6 and Python >= 3.12 (.venv-django6)
	@test -n "$(PYTHON312)" || { echo "no Python >= 3.12 found: set PYTHON312=/path/to/python3.12"; exit 1; }
	test -x .venv-django6/bin/python || $(PYTHON312) -m venv .venv-django6
	.venv-django6/bin/python -m pip install --quiet --disable-pip-version-check -e '.[postgres]' 'django>=6.0' pytest pytest-timeout
	.venv-django6/bin/python -m pytest -q tests/contrib_django -p no:cacheprovider

# The whole suite on another Python, in a venv of its own (.venv-py3.13 for
# PY=3.13) with the same extras as .venv: CI runs 3.11 only, within its time
# budget, so this is not part of `make test`. It finds pyenv's newest $(PY).* or
# python$(PY) on PATH; PY_PYTHON=/path/to/python chooses. On 3.12 and later the
# django extra installs Django 6, so tests/contrib_django runs on it there.
# PYTEST_ARGS=tests/unit runs a part.
PY ?=
PY_PYTHON ?= $(firstword $(lastword $(wildcard $(HOME)/.pyenv/versions/$(PY).*/bin/python$(PY))) $(shell command -v python$(PY) 2>/dev/null))
PYTEST_ARGS ?= -n 3 --dist loadfile --durations=15
test-python: pgbouncer chromium ## The whole suite on another Python in its own venv (PY=3.13; not in make test)
	@test -n "$(PY)" || { echo "which Python? make test-python PY=3.13"; exit 1; }
	@test -n "$(PY_PYTHON)" || { echo "no Python $(PY) found: set PY_PYTHON=/path/to/python$(PY)"; exit 1; }
	$(MAKE) --no-print-directory install PYTHON=$(PY_PYTHON) VENV=.venv-py$(PY)
	.venv-py$(PY)/bin/pytest $(PYTEST_ARGS)

lint: install ## ruff, ruff format --check, import layers
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/lint-imports

format: install ## Format the code
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

typecheck: install ## mypy --strict on the package
	$(BIN)/mypy

# Strict: any warning (a broken link, a docstring mkdocstrings cannot read) fails the build.
docs: install ## Build the documentation site into site/ (MkDocs, strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

check: lint typecheck docs test ## Everything CI should see

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $@

# make bench ends with the dashboard's pages over a 1,000,000-row table with a 600,000-job backlog.
DASHBOARD_BENCH_ARGS ?= --rows 400000 --available 600000 --repeat 3

# oban needs Python >= 3.12: run.py makes .venv-oban for it with a Python >= 3.12
# found on the machine (python3.12 on PATH, pyenv's 3.12.*; see benchmarks/oban_env.py)
# and installs benchmarks/requirements-oban.txt there; with none, oban is n/a.
bench: $(VENV)/.bench-installed ## Benchmark vs procrastinate, pgqueuer, oban (own venv, Python >= 3.12), raw SQL, dashboard pages (BENCH_ARGS=--quick)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.dashboard_pages $(DASHBOARD_BENCH_ARGS)

# The long chaos soak with flow control on (a concurrency cap and a rate limit
# on one queue, serial keys on another's jobs), PostgreSQL (a private server:
# needs initdb, see benchmarks/soak/README.md; with partitions: workers in
# network namespaces, so root, ip and iptables, installed when missing) then SQLite. The plain soak
# without limits: python -m benchmarks.soak.run (same README).
SOAK_MINUTES ?= 5
SOAK_ARGS ?= --noop-jobs 50000
soak: install ## Long chaos soak with queue limits on (partitions too on PostgreSQL), PostgreSQL then SQLite (SOAK_MINUTES=5 each)
	$(BIN)/python -m benchmarks.soak.run --backend postgres --minutes $(SOAK_MINUTES) --limits --partitions $(SOAK_ARGS)
	$(BIN)/python -m benchmarks.soak.run --backend sqlite --minutes $(SOAK_MINUTES) --limits $(SOAK_ARGS)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .venv-oban .venv-django6 .venv-python* .venv-py3* site .pytest_cache .mypy_cache .ruff_cache jobkeeper-demo.db* jobkeeper-demo.log
