# Two commands for a newcomer: `make demo` and `make test`. Both create .venv first if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The sentinels record a finished install; they are rebuilt when the dependencies change.
SENTINEL := $(VENV)/.installed
AIRFLOW_SENTINEL := $(VENV)/.installed-airflow
# The Spark provider requires pyspark-client, which ships its own `pyspark` package (Spark Connect
# 4.2) over PySpark 4.3's files: it is installed without dependencies, the rest comes from the
# `airflow` extra. `pip check` then reports that one missing requirement, and only that.
SPARK_PROVIDER := apache-airflow-providers-apache-spark==6.3.4

.PHONY: setup setup-airflow setup-browser demo test bench lint gpu-check clean

setup: $(SENTINEL)

# Airflow and the DAG tests' needs (make test runs them, so CI does too).
setup-airflow: $(AIRFLOW_SENTINEL)

# Debian's Chromium for the /docs browser test (playwright drives it; `playwright install` would
# download a browser build, which this network does not allow). Needs root, as CI runs.
setup-browser:
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium)

$(SENTINEL): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel is local here; an unpinned resolve would pull a CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

$(AIRFLOW_SENTINEL): $(SENTINEL)
	$(BIN)/python -m pip install --quiet -e '.[dev,airflow]'
	$(BIN)/python -m pip install --quiet --no-deps $(SPARK_PROVIDER)
	$(BIN)/python -c "import pyspark, sys; sys.exit(None if pyspark.__version__.startswith('4.3.') else 'pyspark replaced by ' + pyspark.__version__)"
	touch $@

demo: setup
	$(BIN)/fraudctl demo

# Two pytest-xdist workers, one per core: most tests wait on a JVM, a broker or a subprocess starting,
# and a second worker fills that wait (27 -> 20 min, fresh clone). Each file runs whole on one worker, and
# tests/airflow as one unit (tests/conftest.py); collection order, not xdist's most-tests-first, so
# the two longest units (tests/airflow's story, tests/demo) start first. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup-airflow setup-browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: setup
	$(BIN)/fraudctl bench all

lint: setup
	$(BIN)/ruff check pipeline models jobs tests airflow_dags

gpu-check: setup
	$(BIN)/python jobs/gpu_check.py

clean:
	rm -rf .state bench/results
