# Two commands for a newcomer: `make demo` and `make test`. Both create .venv first if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The sentinel records a finished install; it is rebuilt when the dependencies change.
SENTINEL := $(VENV)/.installed

.PHONY: setup demo test bench lint gpu-check clean

setup: $(SENTINEL)

$(SENTINEL): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel is local here; an unpinned resolve would pull a CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/fraudctl demo

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/fraudctl bench all

lint: setup
	$(BIN)/ruff check pipeline models jobs tests airflow_dags

gpu-check: setup
	$(BIN)/python jobs/gpu_check.py

clean:
	rm -rf .state bench/results
