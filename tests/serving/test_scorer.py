"""The scorer: refuses models of another feature schema, scores like training does, explains by occlusion."""

from __future__ import annotations

import copy
import math

import pytest

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.features import definitions as fd
from pipeline.serving.errors import ModelRejected
from pipeline.serving.features import warmup_rows
from pipeline.serving.scorer import Scorer, check_feature_schema
from tests.serving import factory


def test_a_model_of_an_older_feature_schema_is_refused_by_name(trained):
    with pytest.raises(ModelRejected, match="amount_log"):
        Scorer(trained.good, 1, 3)


def test_categorical_cardinalities_must_match_the_definitions():
    resized = {**fd.CATEGORICAL_FEATURES, "mcc_code": 64}
    with pytest.raises(ModelRejected, match="mcc_code"):
        check_feature_schema(FraudModelConfig(fd.NUMERIC_FEATURES, resized))
    check_feature_schema(FraudModelConfig(fd.NUMERIC_FEATURES[:5], {"channel_code": 16}))  # a subset is fine


def test_scores_equal_the_training_side_tensor_path(models):
    scorer = Scorer(models.good, 7, explain_top_k=0)
    rows = warmup_rows(factory.PARAMS, 20)
    expected = [factory.score_row(models.good, row) for row in rows]
    assert [scorer.score(row).score for row in rows] == pytest.approx(expected, rel=1e-6)
    assert scorer.score_rows(rows) == pytest.approx(expected, rel=1e-5)  # batched float32 kernels


def test_attribution_is_the_score_change_when_a_feature_is_missing(models):
    scorer = Scorer(models.good, 7, explain_top_k=4)
    row = warmup_rows(factory.PARAMS, 12)[-1]
    scored = scorer.score(row)
    assert len(scored.top_features) == 4
    for attribution in scored.top_features:
        blanked = {**row, attribution.feature: math.nan if attribution.feature in fd.NUMERIC_FEATURES else 0}
        assert attribution.contribution == pytest.approx(scored.score - factory.score_row(models.good, blanked),
                                                         rel=1e-4, abs=1e-7)
        assert attribution.value == row[attribution.feature]
    every = [abs(scored.score - factory.score_row(models.good, {**row, name: math.nan}))
             for name in fd.NUMERIC_FEATURES]
    assert abs(scored.top_features[0].contribution) >= max(every) - 1e-7  # the strongest comes first


def test_only_payments_scoring_at_least_the_floor_are_explained(models):
    rows = warmup_rows(factory.PARAMS, 20)
    everyone = Scorer(models.good, 7, explain_top_k=3).score_many(rows)
    floor = sorted(s.score for s in everyone)[len(rows) // 2]
    flagged = Scorer(models.good, 7, explain_top_k=3, explain_min_score=floor).score_many(rows)
    assert [s.score for s in flagged] == [s.score for s in everyone]
    explained = [s for s in flagged if s.top_features]
    assert 0 < len(explained) < len(rows)
    for all_explained, maybe in zip(everyone, flagged, strict=True):
        assert maybe.top_features == (all_explained.top_features if all_explained.score >= floor else ())


def test_warm_up_refuses_scores_that_are_not_probabilities(models):
    broken: FraudModel = factory.with_nan_output(models.good)
    with pytest.raises(ModelRejected, match=r"outside \[0, 1\]"):
        Scorer(broken, 3, 3).warm_up(warmup_rows(factory.PARAMS, 4))
    Scorer(copy.deepcopy(models.good), 3, 3).warm_up(warmup_rows(factory.PARAMS, 4))


def test_scoring_together_equals_scoring_one_by_one(models, monkeypatch):
    import pipeline.serving.scorer as scorer_module
    monkeypatch.setattr(scorer_module, "FORWARD_CHUNK", 7)  # 20 rows explained: three forwards
    scorer = Scorer(models.good, 7, explain_top_k=3)
    rows = warmup_rows(factory.PARAMS, 20)
    alone = [scorer.score(row) for row in rows]
    together = scorer.score_many(rows)
    assert [s.score for s in together] == pytest.approx([s.score for s in alone], rel=1e-5, abs=1e-8)  # float32 batches
    for a, b in zip(alone, together, strict=True):
        assert [t.feature for t in b.top_features] == [t.feature for t in a.top_features]
        assert [t.value for t in b.top_features] == [t.value for t in a.top_features]
        assert [t.contribution for t in b.top_features] == pytest.approx([t.contribution for t in a.top_features],
                                                                          rel=1e-4, abs=1e-7)
    assert scorer.score_many([]) == []


def test_warm_up_switches_to_the_traced_graph_which_scores_and_explains_like_the_module(models):
    rows = warmup_rows(factory.PARAMS, 20)
    eager = Scorer(models.good, 7, explain_top_k=3)
    traced = Scorer(models.good, 7, explain_top_k=3)
    traced.warm_up(warmup_rows(factory.PARAMS, 4))
    assert (eager.forward, traced.forward) == ("eager", "torchscript")
    for a, b in zip(eager.score_many(rows), traced.score_many(rows), strict=True):
        assert b.score == pytest.approx(a.score, abs=1e-6)
        assert [t.feature for t in b.top_features] == [t.feature for t in a.top_features]
    assert traced.score_many(rows[:1])[0].score == pytest.approx(eager.score(rows[0]).score, abs=1e-6)  # batch of one


def test_a_graph_that_fails_to_trace_or_disagrees_leaves_the_version_serving_eagerly(models, monkeypatch):
    import pipeline.serving.scorer as scorer_module
    rows = warmup_rows(factory.PARAMS, 4)

    def untraceable(model):
        raise RuntimeError("no TorchScript in this torch")

    def off_by_a_little(model):
        return lambda numeric, categorical: model.calibrated_logit(numeric, categorical) + 1e-4

    for replacement in (untraceable, off_by_a_little):
        monkeypatch.setattr(scorer_module, "traced_logit", replacement)
        scorer = Scorer(models.good, 7, explain_top_k=3)
        scorer.warm_up(rows)
        assert scorer.forward == "eager"
        assert scorer.score(rows[0]).score == factory.score_row(models.good, rows[0])


def test_a_blend_scores_through_the_graph_and_its_booster_as_the_model_does(models):
    import lightgbm as lgb
    import numpy as np

    from models.gbm import GbmTerm

    rows = warmup_rows(factory.PARAMS, 64)
    blend = copy.deepcopy(models.good)
    names = (*blend.config.numeric_features, *blend.config.categorical_features)
    x = np.array([[row[n] for n in names] for row in rows], dtype=np.float64)
    rng = np.random.default_rng(0)
    booster = lgb.train({"objective": "binary", "num_leaves": 4, "min_data_in_leaf": 5, "verbose": -1,
                         "num_threads": 1}, lgb.Dataset(x, rng.integers(0, 2, len(rows))), num_boost_round=10)
    categorical = tuple(range(len(blend.config.numeric_features), len(names)))
    blend.gbm = GbmTerm(booster, 0.8, names, categorical, booster.current_iteration())
    scorer = Scorer(blend, 9, explain_top_k=2)
    scorer.warm_up(rows)
    assert scorer.forward == "torchscript"
    network_only = Scorer(models.good, 9, explain_top_k=0)
    for row in rows[:8]:
        assert scorer.score(row).score == pytest.approx(factory.score_row(blend, row), abs=1e-6)
    assert scorer.score_rows(rows[:8]) != network_only.score_rows(rows[:8])
