"""Models come from the configured registry as tensors, with the operating points they ship: no pyfunc code
runs, no path escapes the download, a damaged operating-points file refuses the version."""

from __future__ import annotations

import shutil

import pytest
import yaml

from pipeline.registry.errors import ModelLoadError
from pipeline.serving.features import warmup_rows
from pipeline.serving.model_source import RegistryModelSource, model_directory
from tests.registry.conftest import version_artifact_dir
from tests.serving import factory
from tests.serving.conftest import SHIPPED_BUDGET


def test_fetch_reads_the_safetensors_without_the_pyfunc_code(config, client, models):
    version = factory.register(config, factory.log_model(config, models.good))  # its own log: damaged below
    artifacts = version_artifact_dir(client, config.model_name, version)
    shutil.rmtree(artifacts / "code")  # the models package the pyfunc would import
    (artifacts / "pyfunc_model.py").write_text("raise SystemExit('pyfunc code must never run in the service')\n")
    fetched = RegistryModelSource(config).fetch(version)
    row = warmup_rows(factory.PARAMS, 3)[-1]
    assert factory.score_row(fetched.model, row) == factory.score_row(models.good, row)
    assert fetched.operating_points is None  # logged without them: a model packaged before they existed


def test_fetch_reads_the_operating_points_shipped_beside_the_weights(config, models, online_features):
    points = factory.choose_points(models.good, online_features, SHIPPED_BUDGET)
    version = factory.register(config, factory.log_model(config, models.good, points), points)
    assert RegistryModelSource(config).fetch(version).operating_points == points


def test_a_corrupt_operating_points_file_is_a_load_error(config, models):
    version = factory.register(config, factory.log_model(config, models.good, points_text="{not json"))
    with pytest.raises(ModelLoadError, match="operating_points.json is corrupt .*re-register the training run"):
        RegistryModelSource(config).fetch(version)


def test_a_version_the_registry_does_not_have_is_a_load_error(config, champion):
    with pytest.raises(ModelLoadError, match=f"models:/{config.model_name}/{champion + 1}"):
        RegistryModelSource(config).fetch(champion + 1)


def _pyfunc_dir(tmp_path, model_dir_path: str):
    (tmp_path / "MLmodel").write_text(yaml.safe_dump(
        {"flavors": {"python_function": {"artifacts": {"model_dir": {"path": model_dir_path}}}}}))
    return tmp_path


def test_an_mlmodel_pointing_outside_the_download_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "download").mkdir()
    local = _pyfunc_dir(tmp_path / "download", "../outside")
    with pytest.raises(ModelLoadError, match="points outside the model"):
        model_directory(local, "models:/m/1")


def test_a_pyfunc_without_the_model_dir_artifact_is_refused(tmp_path):
    (tmp_path / "MLmodel").write_text(yaml.safe_dump({"flavors": {"python_function": {"loader_module": "x"}}}))
    with pytest.raises(ModelLoadError, match="not a fraud-model pyfunc"):
        model_directory(tmp_path, "models:/m/1")
    with pytest.raises(ModelLoadError, match="lacks"):
        model_directory(_pyfunc_dir(tmp_path, "artifacts/model"), "models:/m/1")
