# Every target builds .venv itself, so a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow check bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kfactory run campaigns/demo.toml

test: $(STAMP)
	$(BIN)/pytest

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/kfactory bench store --json

clean:
	rm -rf $(VENV) .kfactory .pytest_cache .mypy_cache .ruff_cache
