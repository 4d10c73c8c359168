"""Orphan labels: labels whose transaction is in no raw transaction file (stored or this run's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.orphans import count_orphan_labels, orphan_mask


def parquet(path: Path, transaction_ids: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"transaction_id": pa.array(transaction_ids, pa.string()),
                             "amount": pa.array([1.0] * len(transaction_ids))}), path)
    return path


def test_mask_marks_labels_whose_transaction_is_unknown():
    mask = orphan_mask(pa.array(["a", "b", "a", "c"]), pa.array(["a", "z"]))
    assert mask.to_pylist() == [False, True, False, True]


def test_counts_label_rows_not_distinct_transactions(tmp_path):
    stored = parquet(tmp_path / "tx" / "stored.parquet", ["t1", "t2"])
    this_run = parquet(tmp_path / "tx" / "run.parquet", ["t3"])
    labels = [parquet(tmp_path / "labels" / "a.parquet", ["t1", "t9", "t3"]),
              parquet(tmp_path / "labels" / "b.parquet", ["t9", "t8", "t2"])]
    # t9 twice (a fraud report, then a clearing review) and t8: three orphan rows.
    assert count_orphan_labels(labels, [stored, this_run]) == 3
    assert count_orphan_labels(labels, [stored]) == 4  # without this run's transactions, t3 is orphan too


def test_without_transactions_every_label_is_an_orphan_and_without_labels_none(tmp_path):
    labels = [parquet(tmp_path / "labels.parquet", ["t1", "t2"])]
    assert count_orphan_labels(labels, []) == 2
    assert count_orphan_labels([], [parquet(tmp_path / "tx.parquet", ["t1"])]) == 0
