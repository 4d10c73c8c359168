"""Orphan labels: labels whose transaction is neither committed (the index) nor kept by this run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.id_index import Entries, IdIndex
from pipeline.ingest.identity import transaction_id_hashes
from pipeline.ingest.orphans import count_orphan_labels, orphan_mask


def parquet(path: Path, transaction_ids: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"transaction_id": pa.array(transaction_ids, pa.string()),
                             "is_fraud": pa.array([True] * len(transaction_ids))}), path)
    return path


def hashes(ids: list[str]) -> np.ndarray:
    return transaction_id_hashes(pa.array(ids, pa.string()))


def committed(root: Path, ids: list[str]) -> IdIndex:
    h = hashes(ids)
    n = len(h)
    return IdIndex(root, IdIndex(root, []).with_run(0, Entries(h, h["h1"], np.zeros(n, np.int32), np.zeros(n, np.int32))))


def test_mask_marks_labels_whose_transaction_is_unknown():
    mask = orphan_mask(np.array([1, 2, 1, 3], np.uint64), np.array([True, False, True, False]),
                       np.array([3, 9], np.uint64))
    assert mask.tolist() == [False, True, False, False]


def test_counts_label_rows_not_distinct_transactions(tmp_path):
    index = committed(tmp_path / "index", ["t1", "t2"])
    labels = [parquet(tmp_path / "labels" / "a.parquet", ["t1", "t9", "t3"]),
              parquet(tmp_path / "labels" / "b.parquet", ["t9", "t8", "t2"])]
    # t9 twice (a fraud report, then a clearing review) and t8: three orphan rows.
    assert count_orphan_labels(labels, index, hashes(["t3"])) == 3
    assert count_orphan_labels(labels, index, hashes([])) == 4  # without this run's transactions, t3 is orphan too


def test_without_transactions_every_label_is_an_orphan_and_without_labels_none(tmp_path):
    labels = [parquet(tmp_path / "labels.parquet", ["t1", "t2"])]
    assert count_orphan_labels(labels, IdIndex(tmp_path / "empty", []), hashes([])) == 2
    assert count_orphan_labels([], committed(tmp_path / "index", ["t1"]), hashes([])) == 0
