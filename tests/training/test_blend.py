"""The blend step of finalisation: a booster fitted on the run's train rows (early-stopped on the latest
of them), stacked with the network by the calibration fit cross-fitted over time folds of validation,
kept only when it ranks validation better out of sample, and shipped in best/ and model/ alike."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pipeline.training.blend as blend_module
from models.fraud_mlp import FraudModel, FraudModelConfig, load_model
from models.gbm import GBM_CONFIG_FILE
from pipeline.config import ConfigError
from pipeline.datasets.manifest import load_manifest
from pipeline.decisions.operating_points import DecisionBudget
from pipeline.metrics import average_precision
from pipeline.training.blend import cross_fit_stack, latest_rows, read_split_rows, time_folds
from pipeline.training.calibration import fit_calibration
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.config import BlendConfig
from pipeline.training.evaluate import score_split
from pipeline.training.export import export_model_from_checkpoint, load_checkpoint_model
from pipeline.training.finalize import finalize_run
from pipeline.training.run_dir import RunDir, RunSummary
from tests.training.test_finalize import _loss, _outcome

# min_ap_gain decides keeping: -1 keeps any blend, 1 none (no AP gains a whole point).
ALWAYS, NEVER = BlendConfig(gbm=True, min_ap_gain=-1.0, max_rounds=60), BlendConfig(gbm=True, min_ap_gain=1.0,
                                                                                    max_rounds=60)
DEFAULT_RULE = BlendConfig(gbm=True, max_rounds=60)  # min_ap_gain 0: the blend must gain out of sample


def _finalize(tmp_path, dataset, manifest, blend: BlendConfig, name: str = "run", negative_sample_rate: float = 1.0):
    torch.manual_seed(0)
    model = FraudModel(FraudModelConfig(manifest.numeric_features, dict(manifest.categorical_features),
                                        embedding_dim=2, hidden_dim=8, num_blocks=1))
    run = RunDir(tmp_path / name)
    checkpointer = Checkpointer(run.checkpoints, rank=0, world_size=1, keep_last=2, barrier=lambda: None)
    checkpointer.save(6, 1, {"model": model.state_dict()}, {}, model.config.to_json(), is_best=True)
    summary = finalize_run(run, checkpointer, dataset, manifest, _loss(manifest), _outcome(time.time()),
                           DecisionBudget(), blend, seed=3, negative_sample_rate=negative_sample_rate)
    return run, checkpointer, summary


def _validation_probabilities(model: FraudModel, dataset, manifest) -> np.ndarray:
    x = read_split_rows(dataset, manifest, "validation").inputs
    f = len(manifest.numeric_features)
    numeric, categorical = torch.from_numpy(x[:, :f]).float(), torch.from_numpy(x[:, f:]).long()
    return model.eval().predict_proba(numeric, categorical).numpy().astype(np.float64)


def _out_of_fold_oracle(z: np.ndarray, g: np.ndarray, y: np.ndarray, times: np.ndarray, folds: int) -> np.ndarray:
    """The contract written out by hand: frauds in time order dealt into ``folds`` equal consecutive
    runs, a fold's span of time ending at its last fraud, each span scored by the stack fitted on the
    other rows."""
    fraud_times = np.sort(times[y == 1])
    ends = [fraud_times[len(fraud_times) * k // folds - 1] for k in range(1, folds)]  # last fraud of each fold
    fold = np.searchsorted(np.array(ends), times, side="left")
    out = z.copy()
    for k in range(folds):
        fit = fold != k
        c = fit_calibration(torch.from_numpy(z[fit]), torch.from_numpy(y[fit]), extra=torch.from_numpy(g[fit]))
        out[fold == k] += c.temperature * c.extra_weight * g[fold == k]
    return out


def test_a_kept_blend_is_the_model_the_run_ships_and_scores(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS)
    assert summary.blend is not None and summary.blend.kept and summary.blend.trees >= 1
    shipped = load_model(run.model)
    assert shipped.gbm is not None and shipped.gbm.weight == pytest.approx(summary.blend.gbm_weight)
    assert (checkpointer.best / GBM_CONFIG_FILE).is_file()
    # validation_scores.parquet (what the operating points were chosen on) holds the blend's probabilities
    written = pq.read_table(run.validation_scores).to_pandas()["score"].to_numpy()
    np.testing.assert_allclose(written, _validation_probabilities(shipped, tiny_dataset, tiny_manifest), atol=1e-5)
    # the checkpoint's export (rollback --from-checkpoint) is the same blend
    exported = load_model(export_model_from_checkpoint(checkpointer.best, tmp_path / "exported"))
    np.testing.assert_allclose(_validation_probabilities(exported, tiny_dataset, tiny_manifest), written, atol=1e-5)


def test_the_summary_carries_the_out_of_fold_evidence_behind_the_decision(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS)
    blend = summary.blend
    network = load_checkpoint_model(checkpointer.best, apply_stored_calibration=False)
    network.gbm = None
    scored = score_split(network, tiny_dataset, tiny_manifest, "validation", 0, 1, torch.device("cpu"))
    rows = read_split_rows(tiny_dataset, tiny_manifest, "validation")
    f = len(tiny_manifest.numeric_features)
    boosted = load_model(run.model).gbm.logit(rows.inputs[:, :f], rows.inputs[:, f:]) / blend.gbm_weight
    y, z = scored.labels.astype(np.float64), scored.logits.astype(np.float64)
    out_of_fold = _out_of_fold_oracle(z, boosted, y, rows.event_times, 2)
    assert blend.validation_ap_network == pytest.approx(average_precision(y, z), abs=1e-6)
    assert blend.validation_ap_blend == pytest.approx(average_precision(y, out_of_fold), abs=1e-4)
    assert blend.ap_gain == pytest.approx(blend.validation_ap_blend - blend.validation_ap_network)
    assert blend.decision_rows == len(y) == 600 and blend.decision_positives == int(y.sum()) == 14
    assert blend.stacking_folds == 2 and blend.bootstrap_resamples == ALWAYS.bootstrap_resamples
    assert blend.ap_gain_confidence == 0.95 and blend.ap_gain_lower < blend.ap_gain_upper
    assert blend.bootstrap_cards == len(set(scored.card_ids))
    train_rows = sum(s.rows for s in tiny_manifest.shards_for("train"))
    assert blend.early_stopping_rows == math.ceil(0.1 * train_rows) and blend.train_rows == train_rows - 240
    assert "out-of-fold" in blend.rule and "min_ap_gain = -1" in blend.rule and blend.refit_all_train is False
    # and it survives summary.json
    assert RunSummary.from_json(run.summary.read_text()).blend == blend


def test_a_refit_booster_is_recorded_as_trained_on_every_train_row(tmp_path, tiny_dataset, tiny_manifest):
    refit = dataclasses.replace(ALWAYS, refit_all_train=True)
    run, _, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, refit)
    train_rows = sum(s.rows for s in tiny_manifest.shards_for("train"))
    assert summary.blend.refit_all_train and summary.blend.train_rows == train_rows
    assert summary.blend.early_stopping_rows == math.ceil(0.1 * train_rows)
    shipped = load_model(run.model).gbm
    assert shipped.best_iteration == summary.blend.trees == shipped.booster.current_iteration()
    assert RunSummary.from_json(run.summary.read_text()).blend == summary.blend


def test_a_blend_that_does_not_rank_validation_better_is_dropped(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, NEVER)
    assert summary.blend is not None and not summary.blend.kept and summary.blend.gbm_weight == 0.0
    assert summary.blend.validation_ap_network == pytest.approx(
        average_precision(pq.read_table(run.validation_scores).to_pandas()["label"].to_numpy(),
                          pq.read_table(run.validation_scores).to_pandas()["score"].to_numpy()), abs=1e-4)
    assert load_model(run.model).gbm is None and not (checkpointer.best / GBM_CONFIG_FILE).exists()


def test_finalizing_again_without_the_blend_removes_the_booster(tmp_path, tiny_dataset, tiny_manifest):
    run, checkpointer, _ = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS)
    run.summary.unlink()
    again = finalize_run(run, checkpointer, tiny_dataset, tiny_manifest, _loss(tiny_manifest), _outcome(time.time()),
                         DecisionBudget(), BlendConfig(gbm=False))
    assert again.blend is None and load_model(run.model).gbm is None
    assert not (checkpointer.best / GBM_CONFIG_FILE).exists()


def _with_shuffled_validation_labels(source, target):
    """A copy of the dataset at ``source`` whose validation labels are permuted (features untouched)."""
    shutil.copytree(source, target)
    manifest = load_manifest(target)
    rng = np.random.default_rng(5)
    for shard in manifest.shards_for("validation"):
        path = target / shard.path
        table = pq.read_table(path)
        label = table.column(manifest.label_column).to_numpy()
        shuffled = table.set_column(table.schema.get_field_index(manifest.label_column), manifest.label_column,
                                    pa.array(rng.permutation(label)))
        pq.write_table(shuffled, path, row_group_size=100)
    return manifest


def test_early_stopping_never_sees_validation_rows(tmp_path, tiny_dataset, tiny_manifest):
    """Validation's labels cannot change the booster: it trains and stops on train rows only."""
    shuffled_root = tmp_path / "shuffled"
    shuffled_manifest = _with_shuffled_validation_labels(tiny_dataset, shuffled_root)
    run_a, _, summary_a = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS, name="a")
    run_b, _, summary_b = _finalize(tmp_path, shuffled_root, shuffled_manifest, ALWAYS, name="b")
    assert summary_a.blend.trees == summary_b.blend.trees
    rows = read_split_rows(tiny_dataset, tiny_manifest, "train")
    f = len(tiny_manifest.numeric_features)
    gbm_a, gbm_b = load_model(run_a.model).gbm, load_model(run_b.model).gbm
    np.testing.assert_allclose(gbm_a.logit(rows.inputs[:, :f], rows.inputs[:, f:]) / gbm_a.weight,
                               gbm_b.logit(rows.inputs[:, :f], rows.inputs[:, f:]) / gbm_b.weight, rtol=1e-12)


def _drifting_train_rows(rows: int = 10_000, seed: int = 0):
    """Train rows whose frauds follow feature 0 throughout, and, in the latest tenth only (the
    early-stopping rows), also a new pattern: feature 1 above 1. A manifest-like naming two numeric
    features and no categorical ones."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2))
    times = np.arange(rows, dtype=np.int64)
    stopping = latest_rows(times, 0.1)
    labels = (rng.random(rows) < 1 / (1 + np.exp(-(3 * x[:, 0] - 4)))).astype(np.float64)
    labels[stopping & (x[:, 1] > 1)] = 1.0
    manifest = type("Manifest", (), {"numeric_features": ("f0", "f1"), "categorical_features": {}})()
    return manifest, blend_module.SplitRows(x, labels, times, np.ones(rows)), stopping


def test_the_refit_trains_on_every_train_row_for_the_rounds_the_latest_rows_chose():
    """Refit off: the latest rows stop the booster and are not in its fit, so it cannot know the
    pattern only they hold. Refit on: the same number of rounds, trained again with those rows in."""
    manifest, train, stopping = _drifting_train_rows()
    config = BlendConfig(gbm=True, max_rounds=300, early_stopping_rounds=20, min_data_in_leaf=5)
    stopped = blend_module.fit_booster(manifest, train, stopping, config, seed=1)
    refit = blend_module.fit_booster(manifest, train, stopping, dataclasses.replace(config, refit_all_train=True),
                                     seed=1)
    assert refit.best_iteration == stopped.best_iteration and refit.booster.current_iteration() == refit.best_iteration
    # Probes at feature 0 = 0 (a fraud rate near 2%), inside the new pattern and outside it: only
    # feature 1 tells them apart, and only the latest rows teach it.
    inside, outside = (np.array([[0.0, v] for v in values]) for values in ((1.5, 2.0, 2.5), (-1.0, 0.0, 0.5)))
    lift = [term.logit(inside, np.zeros((3, 0))).mean() - term.logit(outside, np.zeros((3, 0))).mean()
            for term in (stopped, refit)]
    assert abs(lift[0]) < 0.2 and lift[1] > lift[0] + 0.3


class _LeafOnValidationNoise:
    """Stands in for a booster with one leaf that isolated a few validation rows by chance: a large
    raw score on exactly those rows (found by their ``noise`` feature), 0 elsewhere."""

    def __init__(self, noise_values: np.ndarray, noise_column: int) -> None:
        self.noise_values, self.noise_column, self.best_iteration = noise_values, noise_column, 1

    def logit(self, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        return 6.0 * np.isin(numeric[:, self.noise_column], self.noise_values)


def test_a_booster_that_fits_validation_noise_is_not_kept(tmp_path, tiny_dataset, tiny_manifest, monkeypatch):
    """Three frauds and a genuine payment early in validation, four genuine payments late, share a leaf:
    the stack fitted in sample rides it to a better validation AP, but the leaf says nothing about the
    other half of the day, so the out-of-fold gain is negative and the blend is not kept."""
    rows = read_split_rows(tiny_dataset, tiny_manifest, "validation")
    noise_column = tiny_manifest.numeric_features.index("noise")
    fold = time_folds(rows.event_times, rows.labels, 2)
    pick = np.concatenate([np.flatnonzero((fold == 0) & (rows.labels == 1))[:3],
                           np.flatnonzero((fold == 0) & (rows.labels == 0))[:1],
                           np.flatnonzero((fold == 1) & (rows.labels == 0))[:4]])
    leaf = _LeafOnValidationNoise(rows.inputs[pick, noise_column], noise_column)
    monkeypatch.setattr(blend_module, "fit_booster", lambda *args, **kwargs: leaf)

    run, _, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, DEFAULT_RULE)

    scores = pq.read_table(run.validation_scores).to_pandas()
    z = np.log(scores["score"] / (1 - scores["score"])).to_numpy()  # the network's log-odds, up to a calibration
    y = scores["label"].to_numpy().astype(np.float64)
    g = leaf.logit(rows.inputs[:, :len(tiny_manifest.numeric_features)], rows.inputs[:, :0])
    in_sample = fit_calibration(torch.from_numpy(z), torch.from_numpy(y), extra=torch.from_numpy(g))
    assert average_precision(y, z + in_sample.temperature * in_sample.extra_weight * g) > average_precision(y, z) + 0.02
    assert not summary.blend.kept and summary.blend.ap_gain < 0
    assert load_model(run.model).gbm is None


def test_time_folds_are_consecutive_spans_holding_equal_frauds():
    rng = np.random.default_rng(0)
    times = rng.permutation(1_000)  # file order is not time order
    labels = (rng.random(1_000) < 0.03).astype(np.float64)
    fold = time_folds(times, labels, 3)
    by_time = fold[np.argsort(times)]
    assert np.all(np.diff(by_time) >= 0) and set(by_time) == {0, 1, 2}
    frauds = [int(labels[fold == k].sum()) for k in range(3)]
    assert max(frauds) - min(frauds) <= 1 and sum(frauds) == labels.sum()


def test_the_early_stopping_rows_are_the_latest_train_rows():
    times = np.array([5, 1, 9, 3, 7, 2, 8, 0, 6, 4])
    assert sorted(times[latest_rows(times, 0.25)]) == [7, 8, 9]  # ceil(2.5) rows


def test_a_fold_is_scored_by_a_stack_that_never_saw_its_labels():
    rng = np.random.default_rng(1)
    n = 400
    y = (rng.random(n) < 0.2).astype(np.float64)
    z, g = rng.normal(0, 1, n) + y, rng.normal(0, 1, n) + 0.5 * y
    fold = (np.arange(n) >= n // 2).astype(np.int64)
    relabelled = y.copy()
    relabelled[fold == 0] = rng.permutation(y[fold == 0])  # fold 0's labels change, its rows do not
    before, after = cross_fit_stack(z, g, y, fold), cross_fit_stack(z, g, relabelled, fold)
    np.testing.assert_array_equal(before[fold == 0], after[fold == 0])
    assert not np.allclose(before[fold == 1], after[fold == 1])  # fold 1's stack was fitted on fold 0


def test_blend_settings_that_cannot_decide_out_of_sample_are_refused():
    with pytest.raises(ConfigError, match="stacking_folds"):
        BlendConfig(stacking_folds=1)
    with pytest.raises(ConfigError, match="early_stopping_share"):
        BlendConfig(early_stopping_share=0.0)


def test_a_summary_written_before_out_of_fold_decisions_still_reads(tmp_path, tiny_dataset, tiny_manifest):
    run, _, summary = _finalize(tmp_path, tiny_dataset, tiny_manifest, NEVER)
    old = json.loads(run.summary.read_text())
    old["blend"] = {k: old["blend"][k] for k in ("kept", "trees", "gbm_weight", "validation_ap_network",
                                                 "validation_ap_blend", "train_rows")}
    read = RunSummary.from_json(json.dumps(old))
    assert read.blend.rule is None and read.blend.ap_gain is None
    assert read.blend.validation_ap_network == summary.blend.validation_ap_network


def test_the_negative_sample_keeps_every_fraud_and_weighs_kept_genuine_rows_by_one_over_the_rate(tiny_dataset,
                                                                                                  tiny_manifest):
    every = read_split_rows(tiny_dataset, tiny_manifest, "train")
    sampled = read_split_rows(tiny_dataset, tiny_manifest, "train", seed=4, negative_share=0.25)
    frauds, genuine = int(every.labels.sum()), int((every.labels == 0).sum())
    assert int(sampled.labels.sum()) == frauds
    assert 0.2 * genuine < int((sampled.labels == 0).sum()) < 0.3 * genuine
    np.testing.assert_array_equal(sampled.weights, np.where(sampled.labels > 0.5, 1.0, 4.0))
    np.testing.assert_array_equal(every.weights, np.ones(len(every.labels)))
    # every fraud row itself, in file order
    np.testing.assert_array_equal(sampled.inputs[sampled.labels > 0.5], every.inputs[every.labels > 0.5])


@pytest.mark.parametrize("weigh", [False, True])
def test_a_sampled_run_weighs_its_boosters_genuine_rows_only_when_configured(tmp_path, tiny_dataset, tiny_manifest,
                                                                               monkeypatch, weigh):
    """[blend] weigh_sampled_negatives (off by default): the booster fits the same sampled rows, its
    genuine ones weighing 1 / rate only when on."""
    seen = []
    real_fit = blend_module.fit_booster
    monkeypatch.setattr(blend_module, "fit_booster", lambda m, train, *rest: seen.append(train) or real_fit(m, train, *rest))
    config = ALWAYS if not weigh else dataclasses.replace(ALWAYS, weigh_sampled_negatives=True)
    assert config.weigh_sampled_negatives is weigh
    _finalize(tmp_path, tiny_dataset, tiny_manifest, config, name="sampled", negative_sample_rate=0.25)
    (train,) = seen
    expected = np.where(train.labels > 0.5, 1.0, 4.0 if weigh else 1.0)
    np.testing.assert_array_equal(train.weights, expected)
    assert (train.labels == 0).any()


def test_a_sampled_run_fits_its_booster_on_the_negative_sample(tmp_path, tiny_dataset, tiny_manifest):
    """The booster's fixed cost shrinks with the network's sample: its train and early-stopping rows are
    every fraud and about ``rate`` of the genuine rows."""
    _, _, full = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS, name="full")
    _, _, sampled = _finalize(tmp_path, tiny_dataset, tiny_manifest, ALWAYS, name="sampled", negative_sample_rate=0.25)
    every = read_split_rows(tiny_dataset, tiny_manifest, "train")
    frauds = int(every.labels.sum())
    seen = sampled.blend.train_rows + sampled.blend.early_stopping_rows
    assert full.blend.train_rows + full.blend.early_stopping_rows == len(every.labels)
    assert frauds + 0.2 * (len(every.labels) - frauds) < seen < frauds + 0.3 * (len(every.labels) - frauds)
    assert sampled.blend.trees >= 1
