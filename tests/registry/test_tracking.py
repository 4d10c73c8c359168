"""Logging a training run into MLflow and registering it as challenger (real SQLite store)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pytest

from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    OPERATING_POINTS_FILE,
    operating_points_from_tags,
    read_operating_points,
)
from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import RunDirError
from pipeline.registry.store import CHALLENGER, connect, version_by_alias
from pipeline.registry.tracking import register_run
from pipeline.training.run_dir import RunDir
from tests.registry import factory
from tests.registry.conftest import version_artifact_dir

# When the tracked run trained (epoch seconds): long before the test registers it.
TRAINING_STARTED, TRAINING_FINISHED = 1_717_000_000.25, 1_717_000_031.5


@pytest.fixture(scope="module")
def registered(world):
    """One run registered once for the read-only assertions below."""
    config = replace(RegistryConfig(), model_name="fd-tracking")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRAUD_STATE_DIR", str(world.state))
        run_dir = RunDir(world.run_dir("tracked", world.good))
        run_dir.write_summary(replace(run_dir.read_summary(), started_at=TRAINING_STARTED,
                                      finished_at=TRAINING_FINISHED))
        version = register_run(run_dir.path, config)
        yield config, connect(config), version, run_dir.path


def _run(registered):
    config, client, version, _ = registered
    return client.get_run(client.get_model_version(config.model_name, str(version)).run_id)


def test_registered_version_is_the_challenger(registered):
    config, client, version, _ = registered
    assert int(version_by_alias(client, config.model_name, CHALLENGER).version) == version


def test_lineage_tags_lead_from_the_version_to_the_exact_data(registered, world):
    config, client, version, run_dir = registered
    mv = client.get_model_version(config.model_name, str(version))
    run = client.get_run(mv.run_id)
    for tags in (mv.tags, run.data.tags):
        assert tags["dataset.content_hash"] == world.manifest.content_hash
        assert tags["dataset.version"] == world.manifest.version
        assert json.loads(tags["dataset.kafka_offsets"]) == world.manifest.kafka_offsets
        assert json.loads(tags["dataset.splits"])["test"] == ["2024-03-07", "2024-03-08"]
        assert len(tags["git.commit"]) == 40 and all(c in "0123456789abcdef" for c in tags["git.commit"])
        assert tags["dataset.root"] == str(world.root.resolve())
    assert run.data.tags["training.run_dir"] == str(run_dir.resolve())


def test_params_steps_and_epoch_metrics_are_logged(registered):
    config, client, version, _ = registered
    run = client.get_run(client.get_model_version(config.model_name, str(version)).run_id)
    assert run.data.params["optimizer.lr"] == "0.01"
    assert run.data.params["world_size"] == "2"
    loss = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in sorted(loss, key=lambda m: m.step)] == list(range(1, 21))
    assert sorted(loss, key=lambda m: m.step)[3].value == pytest.approx(0.6 / 2.0)
    auc = client.get_metric_history(run.info.run_id, "val_auc_roc")
    assert sorted(m.step for m in auc) == [10, 20]
    for key in ("train_bytes_sent", "train_density", "train_samples_per_s"):
        assert key in run.data.metrics


def test_every_metric_is_a_series_and_single_numbers_are_tags(registered):
    config, client, version, run_dir = registered
    run = _run(registered)
    # A single number logged as a metric is a one-point chart in the UI: none may be logged so.
    histories = {k: client.get_metric_history(run.info.run_id, k) for k in run.data.metrics}
    assert [k for k, history in histories.items() if len(history) < 2] == []
    best = RunDir(run_dir).read_summary().best_metrics
    tags = run.data.tags
    assert float(tags["best.auc_roc"]) == pytest.approx(best["auc_roc"], rel=1e-5)
    assert float(tags["best.val_loss"]) == pytest.approx(best["val_loss"], rel=1e-5)
    assert (tags["summary.global_step"], tags["summary.wall_s"], tags["summary.bytes_sent_total"]) == (
        "20", "3.5", "24000")
    assert "summary.started_at" not in tags  # the run's own start time, not a result


def test_run_start_and_end_are_the_training_times(registered):
    info = _run(registered).info
    assert (info.start_time, info.end_time) == (round(TRAINING_STARTED * 1000), round(TRAINING_FINISHED * 1000))
    assert info.status == "FINISHED"


def test_training_dataset_is_the_runs_dataset_input(registered, world):
    trained_on = RunDir(registered[3]).read_dataset()  # the manifest as training saw it (JSON key order)
    inputs = _run(registered).inputs.dataset_inputs
    assert len(inputs) == 1
    dataset = inputs[0].dataset
    assert (dataset.name, dataset.digest) == (world.manifest.version, world.manifest.content_hash[:36])
    assert {t.key: t.value for t in inputs[0].tags} == {
        "mlflow.data.context": "training", "dataset.content_hash": world.manifest.content_hash}
    assert json.loads(dataset.source) == {"uri": str(world.root.resolve())}
    columns = [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]]
    assert columns == [*trained_on.numeric_features, *trained_on.categorical_features, "label"]


def test_the_version_carries_the_operating_points_its_model_ships(registered, tmp_path):
    config, client, version, run_dir = registered
    mv = client.get_model_version(config.model_name, str(version))
    shipped = read_operating_points(RunDir(run_dir).model)
    assert shipped is not None and operating_points_from_tags(mv.tags) == shipped
    assert float(mv.tags["operating_points.review_threshold"]) == shipped.review_threshold
    assert mv.tags["operating_points.budget.review_rate"] == repr(shipped.budget.review_rate)
    # ... and inside the registered model package, beside the weights (what the service reads).
    package = mlflow.artifacts.download_artifacts(f"models:/{config.model_name}/{version}", dst_path=str(tmp_path))
    assert [read_operating_points(p.parent) for p in Path(package).rglob(OPERATING_POINTS_FILE)] == [shipped]


def test_validation_scores_are_a_run_artifact(registered):
    config, client, version, _ = registered
    run_id = client.get_model_version(config.model_name, str(version)).run_id
    assert "run/validation_scores.parquet" in {a.path for a in client.list_artifacts(run_id, "run")}


def test_plots_are_logged_as_png(registered, tmp_path):
    config, client, version, _ = registered
    run_id = client.get_model_version(config.model_name, str(version)).run_id
    names = {a.path for a in client.list_artifacts(run_id, "plots")}
    assert names == {f"plots/{n}.png" for n in
                     ("roc", "precision_recall", "calibration", "score_histogram", "training_curves")}
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="plots/roc.png", dst_path=str(tmp_path))
    assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_pyfunc_scores_raw_rows_like_the_model_and_pickles_nothing(registered, world):
    config, client, version, _ = registered
    model = mlflow.pyfunc.load_model(f"models:/{config.model_name}@{CHALLENGER}")
    assert model.metadata.get_input_schema().input_names() == list(world.manifest.numeric_features) + list(
        world.manifest.categorical_features)
    frame = read_split(world.root, world.manifest, "test")
    np.testing.assert_allclose(model.predict(frame), factory.score(world.good, frame), rtol=1e-6)
    files = {p.name for p in version_artifact_dir(client, config.model_name, version).rglob("*") if p.is_file()}
    assert {"model.safetensors", "model.json", "pyfunc_model.py", "fraud_mlp.py", "input_example.json"} <= files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))]


def test_registering_the_same_run_again_returns_the_same_version(registered):
    config, _, version, run_dir = registered
    assert register_run(run_dir, config) == version


def test_unfinished_run_is_refused_and_registers_nothing(world, config, client):
    run_dir = world.run_dir("unfinished", world.good)
    (run_dir / "summary.json").unlink()
    with pytest.raises(RunDirError, match="did not finish"):
        register_run(run_dir, config)
    assert client.search_model_versions(f"name = '{config.model_name}'") == []


def test_summary_missing_a_required_field_is_refused_by_name(world, config, client):
    run_dir = RunDir(world.run_dir("no-step-count", world.good))
    summary = json.loads(run_dir.summary.read_text())
    del summary["global_step"]
    run_dir.summary.write_text(json.dumps(summary))
    with pytest.raises(RunDirError, match="missing required key 'global_step'"):
        register_run(run_dir.path, config)
    assert client.search_model_versions(f"name = '{config.model_name}'") == []


def test_corrupt_model_in_run_dir_is_refused(world, config, client):
    run_dir = world.run_dir("corrupt", world.good)
    (run_dir / "model" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RunDirError, match="cannot be loaded"):
        register_run(run_dir, config)
    assert client.search_model_versions(f"name = '{config.model_name}'") == []
    shutil.rmtree(run_dir)
