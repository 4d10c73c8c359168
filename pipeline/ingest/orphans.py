"""Orphan labels: kept labels whose transaction the raw store does not hold.

A fraud report can reach the store before its payment does: the payment is still in flight, was
quarantined (and may be re-sent), or lies in a window not ingested yet. Such a label lands like
any other, since its transaction may still come and the dataset joins labels to transactions
only when it is built. Nothing is dropped; each run counts them so that the operator sees them
(``orphan_labels`` in :class:`pipeline.ingest.accounting.TopicAccounting`).

A label is an orphan of a run when its ``transaction_id`` is neither among the committed raw
transactions nor among this run's kept ones (copies already removed). Both are checked by
identity hash (:mod:`pipeline.ingest.identity`): the committed ones with one look-up in the
transactions' identity index, so the cost grows with this run's labels, not with the history.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from pipeline.ingest.id_index import IdIndex
from pipeline.ingest.identity import transaction_id_hashes

LINK = "transaction_id"  # a label's transaction_id names the transaction it reports on


def orphan_mask(label_links: np.ndarray, stored: np.ndarray, this_run: np.ndarray) -> np.ndarray:
    """True where a label's transaction hash (``label_links``) is neither ``stored`` (a bool mask
    from the index, parallel to it) nor among ``this_run``'s kept transaction hashes (pure)."""
    return ~(stored | np.isin(label_links, this_run))


def count_orphan_labels(label_files: list[Path], transactions: IdIndex, this_run: np.ndarray) -> int:
    """How many rows of the raw label files name a transaction that neither the committed store
    (``transactions``, its identity index) nor this run (``this_run``'s hashes) holds."""
    if not label_files:
        return 0
    links = ds.dataset([str(f) for f in label_files], format="parquet").to_table(columns=[LINK])[LINK]
    hashes = transaction_id_hashes(links)
    # One bucket mapped at a time: the driver never holds more than a sixteenth of the touched index.
    return int(orphan_mask(hashes, transactions.lookup(hashes, keep_mapped=False).found, this_run).sum())
