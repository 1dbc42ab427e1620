# jobkeeper developer commands. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.DEFAULT_GOAL := help

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

.PHONY: help install demo test lint format typecheck check bench clean

help: ## List the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv and install jobkeeper with its dev tools

demo: install ## Run the demo on the embedded SQLite default (no server needed)
	$(BIN)/jobkeeper demo

test: install ## Run the whole test suite (SQLite and the PostgreSQL at $$JOBKEEPER_TEST_PG_URL)
	$(BIN)/pytest

lint: install ## ruff, ruff format --check, import layers
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

format: install ## Format the code
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

typecheck: install ## mypy --strict on the package
	$(BIN)/mypy

check: lint typecheck test ## Everything CI should see

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache jobkeeper-demo.db* jobkeeper-demo.log
