# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv if absent
# and installs what it needs (re-installing only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip

.PHONY: demo test bench lint clean

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

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-bench
	for script in bench/[a-z]*.py; do $(BIN)/python $$script || exit 1; done

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build dist src/*.egg-info demo-out .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
