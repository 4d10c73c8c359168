"""Evaluation stands without the registry's storage: no module of ``pipeline.evaluation`` loads MLflow
or ``pipeline.registry``, so the backtest and the benchmarks measure models without either."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import pipeline.evaluation
from pipeline.config import PROJECT_ROOT

EVALUATION_MODULES = sorted(f"pipeline.evaluation.{m.name}" for m in pkgutil.iter_modules(pipeline.evaluation.__path__))

# Prints the loaded modules that are MLflow's or the registry's, in a fresh interpreter.
STORAGE_LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow' or m.startswith('pipeline.registry'))))
"""


def storage_modules_loaded_by(*modules: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", STORAGE_LOADED, *modules], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_package_holds_the_evaluation_modules():
    assert {"pipeline.evaluation.protocol", "pipeline.evaluation.holdout", "pipeline.evaluation.gate",
            "pipeline.evaluation.comparison", "pipeline.evaluation.report"} <= set(EVALUATION_MODULES)


@pytest.mark.parametrize("module", EVALUATION_MODULES)
def test_module_loads_no_mlflow_and_no_registry(module):
    assert storage_modules_loaded_by(module) == []


def test_the_check_itself_sees_the_storage_a_registry_module_loads():
    loaded = storage_modules_loaded_by("pipeline.registry.evaluate")
    assert "mlflow" in loaded and "pipeline.registry.evaluate" in loaded
