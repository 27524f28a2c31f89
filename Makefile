# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv if absent
# and installs what it needs (re-installing only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
LINTED := src tests bench contrib $(wildcard examples scripts)

.PHONY: demo test test-slow test-all lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e ".[dev]"
	touch $@

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e ".[dev,bench]"
	touch $@

demo: $(VENV)/.installed-dev
	$(BIN)/hashlearn demo

# The fast suite: lint, format and type checks, doctests and every test not marked slow
# (<= 4 minutes).
test: lint
	$(BIN)/python -m pytest -q -m "not slow" --doctest-modules src/hashlearn tests

# The slow tests alone (long fits, 10^4-example fuzzing, full reproductions in quick mode).
test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m slow tests

# Everything: what CI runs.
test-all: test test-slow

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy  # [tool.mypy] in pyproject.toml: src/hashlearn

bench: $(VENV)/.installed-bench
	for script in bench/[a-z]*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info demo-out .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
