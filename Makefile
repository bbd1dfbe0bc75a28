# The README's two Quick-start commands:
#   make run    set up, bake the default project, train it with 2 processes on its sample data
#   make test   set up, run the whole test suite (what CI runs)
# and, for the template's developers:
#   make bench  set up, run every benchmark, write benchmarks/RESULTS.md and benchmarks/parity.png
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
DEMO := build/dist_train

.PHONY: setup run test bench lint clean

setup: $(VENV)/.installed

# torch first and pinned: an unpinned torch (or a package that needs one) pulls GBs of CUDA packages.
$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

run: setup
	rm -rf $(DEMO)
	$(BIN)/cookiecutter --no-input . --output-dir build
	cd $(DEMO) && PATH="$(BIN):$$PATH" NPROC_PER_NODE=2 bash run.sh

test: setup
	PATH="$(BIN):$$PATH" $(BIN)/python -m pytest

# matplotlib draws the chart; only the benchmarks need it.
bench: setup
	$(BIN)/pip install --quiet --disable-pip-version-check matplotlib
	cd benchmarks && PATH="$(BIN):$$PATH" $(BIN)/python run_all.py

lint: setup
	$(BIN)/pre-commit run --all-files

clean:
	rm -rf build $(VENV)
