"""A night's lookback-cache cost as the card base turns over: vocabulary compaction against none.

Drives the lookback cache (:mod:`pipeline.datasets.lookback_cache`) the way a one-date night does
(:func:`pipeline.ingest.block_payments.read_block_payments` with a warm cache): let go of the dates
before the lookback, read the vocabulary and the 30 cached dates, code the new date's ids, write the
grown vocabulary (fsynced) and the new date. The payments are synthetic: ``cards`` cards are active
on any day and the active range slides so that the whole base is replaced every ``turnover_days``;
merchants and countries are fixed sets. Without compaction the vocabulary holds every card ever
seen, so a night's cost grows with the number of turnovers; with it, with the live set only.

Reported per variant and turnover count: the seconds of the last nights (median), the vocabulary's
length and file size, and the process's peak RSS (each variant runs in a fresh process).
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.datasets.id_vocabulary import IdVocabulary
from pipeline.datasets.lookback_cache import CODED_SCHEMA, MIN_LIVE_SHARE, VOCABULARY_FILE, LookbackCache

LOOKBACK_DAYS = 30  # as pipeline.features.definitions.LOOKBACK_DAYS: 30 cached dates and the new one
FIRST_DAY = date(2026, 1, 1)
COUNTRIES = 40


@dataclass(frozen=True)
class Turnover:
    """The synthetic card base: ``cards`` active at once, all replaced every ``turnover_days``;
    ``merchants`` fixed."""

    cards: int
    payments_per_day: int
    turnover_days: int
    merchants: int = 5_000

    def payments(self, day: int, rng: np.random.Generator) -> pa.Table:
        """Day ``day``'s payments: card, merchant and country ids as strings."""
        first_card = day * self.cards // self.turnover_days
        n = self.payments_per_day
        card = first_card + rng.integers(0, self.cards, n)
        return pa.table({"card_id": pa.array(np.char.add("c-", card.astype(str))),
                         "merchant_id": pa.array(np.char.add("m-", rng.integers(0, self.merchants, n).astype(str))),
                         "country": pa.array(np.char.add("k-", rng.integers(0, COUNTRIES, n).astype(str)))})


@dataclass(frozen=True)
class Night:
    """What one night cost and left behind."""

    day: int
    seconds: float
    vocabulary_ids: int
    vocabulary_bytes: int
    live_ids: int


def coded_date(raw: pa.Table, vocabulary: IdVocabulary, *, hash_once: bool) -> tuple[pa.Table, IdVocabulary]:
    """``raw``'s ids coded as the pipeline codes a date (``CODED_SCHEMA``), and the grown vocabulary.
    ``hash_once``: one hash of the vocabulary for the three columns, else one per column (as before)."""
    columns = [raw.column(name) for name in ("card_id", "merchant_id", "country")]
    if hash_once:
        codes, vocabulary = vocabulary.code_columns(*columns)
    else:
        codes = []
        for column in columns:
            coded, vocabulary = vocabulary.code(column)
            codes.append(coded)
    n = raw.num_rows
    table = pa.table({"transaction_id": pa.array([None] * n, pa.string()), "card": codes[0], "merchant": codes[1],
                      "country": codes[2], "ts_us": np.zeros(n, np.int64), "amount": np.ones(n)})
    return table.cast(CODED_SCHEMA), vocabulary


def play_night(cache: LookbackCache, base: Turnover, day: int, rng: np.random.Generator, *,
               min_live_share: float, hash_once: bool) -> Night:
    """One night: the cache's work for the new date ``day`` (module doc); ``min_live_share`` 0: never compact."""
    started = time.perf_counter()
    today = FIRST_DAY + timedelta(days=day)
    cache.discard_before(today - timedelta(days=LOOKBACK_DAYS), min_live_share=min_live_share)
    vocabulary = cache.read_vocabulary()
    for back in range(1, LOOKBACK_DAYS + 1):
        cache.read_date(today - timedelta(days=back), "synthetic", vocabulary)
    coded, grown = coded_date(base.payments(day, rng), vocabulary, hash_once=hash_once)
    if grown is not vocabulary:
        cache.write_vocabulary(grown)
    cache.write_date(today, "synthetic", grown, coded)
    seconds = time.perf_counter() - started
    return Night(day, seconds, len(grown), (cache.root / VOCABULARY_FILE).stat().st_size,
                 int(cache.live_ids(grown).sum()))


def play_nights(root: Path, base: Turnover, turnovers: int, *, min_live_share: float = MIN_LIVE_SHARE,
                hash_once: bool = True, seed: int = 0) -> list[Night]:
    """Nights from an empty cache at ``root`` until the card base has turned over ``turnovers`` times
    after the first full lookback."""
    cache, rng = LookbackCache(root), np.random.default_rng(seed)
    nights = LOOKBACK_DAYS + 1 + turnovers * base.turnover_days
    return [play_night(cache, base, day, rng, min_live_share=min_live_share, hash_once=hash_once)
            for day in range(nights)]


def _measure(base: Turnover, turnovers: int, compact: bool) -> dict:
    with tempfile.TemporaryDirectory() as root:
        nights = play_nights(Path(root), base, turnovers, min_live_share=MIN_LIVE_SHARE if compact else 0.0,
                             hash_once=compact)
    last = nights[-7:]
    return {"turnovers": turnovers, "compaction": compact,
            "night_s_median_last7": round(statistics.median(n.seconds for n in last), 4),
            "night_s_max_last7": round(max(n.seconds for n in last), 4),
            "night_s_max_all": round(max(n.seconds for n in nights), 4),
            "vocabulary_ids": last[-1].vocabulary_ids, "vocabulary_bytes": last[-1].vocabulary_bytes,
            "live_ids": last[-1].live_ids,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def measure(base: Turnover, turnovers: int, compact: bool) -> dict:
    """One variant's figures (the module doc), measured in a fresh process so peak RSS is its own;
    ``compact`` False is the code before compaction: never compact, one vocabulary hash per column."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_measure, base, turnovers, compact).result()


def run(quick: bool = False) -> dict:
    base = Turnover(cards=5_000, payments_per_day=4_000, turnover_days=10) if quick else \
        Turnover(cards=50_000, payments_per_day=25_000, turnover_days=10)
    rows = [measure(base, turnovers, compact) for turnovers in (1, 10) for compact in (False, True)]
    return {"card_base": asdict(base), "min_live_share": MIN_LIVE_SHARE, "nights": rows}


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
