"""The scoring side reads the raw store with Arrow: none of our modules it imports needs Spark.

(MLflow, which the service also loads, imports pyspark by itself whenever it is installed; that
is its choice, not ours, so this checks our modules with pyspark made unimportable.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.config import PROJECT_ROOT

SPARK_FREE = ["pipeline.ingest.raw_layout", "pipeline.features.params", "pipeline.features.online",
              "pipeline.features.frame", "pipeline.serving.seed", "pipeline.serving.features",
              "pipeline.serving.consistency"]


@pytest.mark.parametrize("module", SPARK_FREE)
def test_module_imports_with_pyspark_unimportable(module):
    code = f"import sys; sys.modules['pyspark'] = None; import {module}"  # None: any pyspark import fails
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_check_itself_fails_for_a_module_that_needs_spark():
    code = "import sys; sys.modules['pyspark'] = None; import pipeline.ingest.raw_store"
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "pyspark" in done.stderr
