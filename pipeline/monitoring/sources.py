"""Where the monitor reads: the scores topic, the raw store (its Arrow reader, no Spark), the registry.

Thin adapters; everything they return is plain data for the pure modules. A version's reference
(operating points, expected recall, validation scores, a training-split sample) is best effort:
what cannot be found is said in ``notes`` and the figures that need it are left undefined, since
a model moved or registered from a checkpoint must still be monitored on what it decided.
"""

from __future__ import annotations

import math
import tempfile
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from pipeline.contract import Kind
from pipeline.datasets.manifest import DatasetManifest, ManifestError, load_manifest
from pipeline.datasets.reader import read_shards
from pipeline.decisions.operating_points import (
    EXPECTED_RECALL_TAG,
    OperatingPoints,
    operating_points_from_tags,
)
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_reader import read_raw
from pipeline.kafka.admin import topic_exists
from pipeline.kafka.reader import ConsumedRecord, read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.monitoring.figures import RankingExpectation, VersionReference, ranking_expectation
from pipeline.monitoring.join import Report
from pipeline.monitoring.missed_frauds import MissedFraudReference, missed_fraud_reference

# Logged at registration (pipeline.registry.tracking, under RUN_ARTIFACTS): spelled out here because
# importing tracking loads torch, which the monitor never needs (tests/monitoring holds them equal).
VALIDATION_SCORES = "run/validation_scores.parquet"
SAMPLE_SEED = 0  # the same training rows on every run: a re-run gives the same PSI
REPORT_COLUMNS = ("transaction_id", "is_fraud", "reported_at")  # what the join reads of a fraud report


# ---- Kafka ----------------------------------------------------------------------------------------


def read_scores(kafka: KafkaConfig, topic: str) -> list[ConsumedRecord] | None:
    """Every record of the scores topic; None when the topic does not exist (nothing was ever scored).
    Raises KafkaUnavailable when the cluster cannot be reached or read."""
    return read_topic(kafka, topic) if topic_exists(kafka, topic) else None


# ---- raw store ------------------------------------------------------------------------------------


def raw_store_until(raw_root: Path) -> date | None:
    """The latest event date of the raw store's committed payments (None: empty), as ingest bounds backfills."""
    return RawStore(raw_root).latest_date(Kind.TRANSACTION)


def read_reports(raw_root: Path, first: date, last: date) -> list[Report]:
    """Fraud reports of report dates ``first .. last`` (committed rows)."""
    table = read_raw(RawStore(raw_root), Kind.LABEL, REPORT_COLUMNS, first, last)
    if table.num_rows == 0:
        return []
    reported = pc.cast(pc.cast(table["reported_at"], pa.timestamp("us", tz="UTC")), pa.int64()).to_pylist()
    return [Report(tid, bool(fraud), at) for tid, fraud, at in
            zip(table["transaction_id"].to_pylist(), table["is_fraud"].to_pylist(), reported, strict=True)]


def payment_cards(raw_root: Path, day: date) -> dict[str, str]:
    """The raw store's payments of event date ``day``: transaction id -> card id."""
    table = read_raw(RawStore(raw_root), Kind.TRANSACTION, ("transaction_id", "card_id"), day, day)
    return dict(zip(table["transaction_id"].to_pylist(), table["card_id"].to_pylist(), strict=True))


# ---- registry -------------------------------------------------------------------------------------


def version_reference(client: MlflowClient, model_name: str, version: int, sample_rows: int) -> VersionReference:
    """What ``model_name`` v``version`` is judged against (see the module doc for what may be missing)."""
    try:
        registered = client.get_model_version(model_name, str(version))
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        return VersionReference(version, None, None, None, "none", None, None, "", frozenset(),
                                (f"v{version} is not a version of {model_name!r} in the registry: "
                                 "nothing to compare it with",))
    tags = dict(registered.tags)
    notes: list[str] = []
    points = _operating_points(tags, notes)
    expected, source = expected_recall(tags, points)
    if expected is None:
        notes.append(f"no {EXPECTED_RECALL_TAG} tag and no validation recall in the operating points: "
                     "recall is reported, not judged")
    scores, ranking, missed = _validation_scores(client, registered.run_id, points, notes)
    features, sample, categorical = _training_sample(tags, sample_rows, notes)
    return VersionReference(version, registered.run_id, points, expected, source, scores, features, sample,
                            categorical, tuple(notes), ranking, missed)


def expected_recall(tags: dict[str, str], points: OperatingPoints | None) -> tuple[float | None, str]:
    """The backtest's expectation: the gate's holdout recall, else the validation recall of the operating points."""
    try:
        value = float(tags[EXPECTED_RECALL_TAG])
        if math.isfinite(value):
            return value, EXPECTED_RECALL_TAG
    except (KeyError, ValueError):
        pass
    if points is not None and points.validation is not None and math.isfinite(points.validation.recall):
        return points.validation.recall, "operating_points.validation.recall"
    return None, "none"


def _operating_points(tags: dict[str, str], notes: list[str]) -> OperatingPoints | None:
    try:
        points = operating_points_from_tags(tags)
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"the version's operating-points tags are unreadable ({exc}): no budget to compare with")
        return None
    if points is None:
        notes.append("the version has no operating points (registered before they existed): no budget to compare with")
    return points


def _validation_scores(client: MlflowClient, run_id: str | None, points: OperatingPoints | None, notes: list[str]
                       ) -> tuple[np.ndarray | None, RankingExpectation | None, MissedFraudReference | None]:
    """The run's validation scores (for the score PSI), the ranking they set as the expectation
    (:func:`pipeline.monitoring.figures.ranking_expectation`) and the fraud cards they let past the
    version's validation review threshold (:func:`pipeline.monitoring.missed_frauds.missed_fraud_reference`;
    None without operating points), from the run's validation_scores.parquet."""
    if not run_id:
        notes.append("the version has no run: no validation scores for the score PSI, the ranking or the missed frauds")
        return None, None, None
    with tempfile.TemporaryDirectory(prefix="monitor-") as tmp:
        try:
            path = client.download_artifacts(run_id, VALIDATION_SCORES, tmp)
            table = pq.read_table(path, columns=["score", "label", "event_time", "card_id"])
        except (MlflowException, OSError, KeyError, pa.ArrowException) as exc:
            notes.append(f"run {run_id} has no readable {VALIDATION_SCORES} ({type(exc).__name__}): no score PSI "
                         "and no ranking or missed frauds judged")
            return None, None, None
    scores = table["score"].to_numpy(zero_copy_only=False).astype(np.float64)
    finite = np.isfinite(scores)
    column = lambda name: table[name].to_numpy(zero_copy_only=False)[finite]  # noqa: E731
    validation = (column("label"), scores[finite], column("event_time"), column("card_id"))
    missed = missed_fraud_reference(*validation, points.review_threshold) if points is not None else None
    return scores[finite], ranking_expectation(*validation), missed


def _training_sample(tags: dict[str, str], rows: int,
                     notes: list[str]) -> tuple[dict[str, np.ndarray] | None, str, frozenset[str]]:
    root, version = tags.get("dataset.root"), tags.get("dataset.version")
    if not root or not version:
        notes.append("the version has no dataset.root / dataset.version tags: no feature PSI")
        return None, "", frozenset()
    try:
        manifest = load_manifest(Path(root), version)
        frame, described = sample_split(Path(root), manifest, "train", rows)
    except (ManifestError, OSError) as exc:
        notes.append(f"training split of {version} under {root} is unreadable ({exc}): no feature PSI")
        return None, "", frozenset()
    features = {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns}
    return features, described, frozenset(manifest.categorical_features)


def sample_split(root: Path, manifest: DatasetManifest, split: str, rows: int):
    """About ``rows`` feature rows of ``split``: whole shards in a seeded random order until twice
    ``rows`` are read, then ``rows`` of them at random. Returns the frame and how it was drawn."""
    shards = manifest.shards_for(split)
    columns = [*manifest.numeric_features, *manifest.categorical_features]
    order = np.random.default_rng(SAMPLE_SEED).permutation(len(shards))
    picked, total = [], 0
    for i in order:
        picked.append(shards[i])
        total += shards[i].rows
        if total >= 2 * rows:
            break
    frame = read_shards(root, picked, columns)
    if len(frame) > rows:
        frame = frame.sample(rows, random_state=SAMPLE_SEED)
    split_rows = sum(s.rows for s in shards)
    return frame, (f"{len(frame)} of {split_rows} {split} rows of {manifest.version} "
                   f"(from {len(picked)} of {len(shards)} shards)")
