# Every target builds .venv itself, so a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow check bench bench-kt bench-host clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kfactory run campaigns/demo.toml

# Three pytest-xdist workers (many tests wait on subprocesses and sockets); a test that
# must not run beside another names an xdist_group.
test: $(STAMP)
	$(BIN)/pytest -n 3 --dist loadgroup

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/kfactory bench store --json

# Kernel Tuner for the comparison bench only (bench/.kt, never a package dependency).
KT := bench/.kt

$(KT)/.installed: $(STAMP)
	$(BIN)/pip install --quiet --target $(KT) kernel_tuner==1.5.0
	touch $@

bench-kt: $(KT)/.installed
	$(BIN)/python bench/kernel_tuner_softmax.py

# This host's row of bench/results/hosts.md: Kernel Tuner, a campaign, the neutral run.
bench-host: $(KT)/.installed
	$(BIN)/python bench/host_figures.py

clean:
	rm -rf $(VENV) .kfactory .pytest_cache .mypy_cache .ruff_cache
