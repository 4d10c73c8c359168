"""The scoring side reads the raw store with Arrow: none of our modules it imports needs Spark.

(MLflow, which the service also loads, imports pyspark by itself whenever it is installed; that
is its choice, not ours, so this checks our modules with pyspark made unimportable.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.config import PROJECT_ROOT

SPARK_FREE = ["pipeline.ingest.raw_layout", "pipeline.features.params", "pipeline.features.online",
              "pipeline.features.frame", "pipeline.serving.seed", "pipeline.serving.features",
              "pipeline.serving.consistency", "pipeline.serving.partitioning", "pipeline.serving.router"]


@pytest.mark.parametrize("module", SPARK_FREE)
def test_module_imports_with_pyspark_unimportable(module):
    code = f"import sys; sys.modules['pyspark'] = None; import {module}"  # None: any pyspark import fails
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_check_itself_fails_for_a_module_that_needs_spark():
    code = "import sys; sys.modules['pyspark'] = None; import pipeline.ingest.raw_store"
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "pyspark" in done.stderr


# Printed when the command exits: which of these modules the process holds (pyspark: loaded ones).
LOADED_AT_EXIT = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(m for m, mod in sys.modules.items() if mod is not None and (
    m.split('.')[0] == 'pyspark' or m in ('mlflow', 'pipeline.serving.service'))))))
from pipeline.cli.main import cli
cli(['serve', '--no-kafka'])
"""


def test_fraudctl_serve_loads_no_spark(tmp_path):
    """The real command, up to reading its configuration (an empty conf dir: it exits 1 there, after
    every import of the service): the modules the process then holds."""
    env = {**os.environ, "FRAUD_CONF_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", LOADED_AT_EXIT], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "ConfigError" in done.stderr, done.stderr[-2000:]
    # It got as far as the service and MLflow, and holds no pyspark module.
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["mlflow", "pipeline.serving.service"]


def test_the_serve_check_sees_pyspark_where_mlflow_loads_it():
    """Without keep_spark_out MLflow's probe loads pyspark (installed here), so the test above can fail."""
    code = "import sys, pipeline.serving.service; print(any(m == 'pyspark' for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
