"""At-least-once delivery on the real broker and Spark: a resent record is a duplicate (or a
conflicting duplicate), never a late event and never a night that fails; the identity index
keeps the check O(new data) and stays consistent with the commit."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest

from pipeline.contract import Kind
from pipeline.ingest import raw_ingest
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.id_index import IdIndex
from pipeline.ingest.identity import transaction_id_hashes
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.offsets import OffsetStore
from pipeline.ingest.progress import Progress
from pipeline.ingest.raw_layout import INDEX_DIR, QUARANTINE, RUN_ID, RawStore
from pipeline.ingest.validate import DETAIL, REASON
from tests.ingest.corpus import label, tx
from tests.ingest.kafka_helpers import produce

pytestmark = [pytest.mark.broker, pytest.mark.spark]
DAY0 = datetime(2026, 1, 1, 10, tzinfo=UTC)


def config(**raw):
    c = load_ingest_config("dev")
    return dataclasses.replace(c, spark=dataclasses.replace(c.spark, shuffle_partitions=2),
                               raw=dataclasses.replace(c.raw, **raw))


def at(day: float) -> str:
    return (DAY0 + timedelta(days=day)).isoformat().replace("+00:00", "Z")


def payment(i: int | str, day: float, **changes) -> bytes:
    return tx(transaction_id=f"t-{i}", event_time=at(day), **changes)


def send(kafka, topic: str, values: list[bytes]) -> None:
    produce(kafka, topic, [(b"k", v, None) for v in values], partition=0)  # one partition: in this order


def ingest(kafka, spark, lines: list[str] | None = None, **raw):
    emit = lines.append if lines is not None else (lambda _line: None)
    return run_raw_ingest(config(**raw), kafka, spark=spark, progress=Progress(emit=emit))


def store() -> RawStore:
    return RawStore(config().raw.root())


def stored(kind: Kind = Kind.TRANSACTION):
    return pads.dataset([str(f) for f in store().committed_files(kind)], format="parquet").to_table()


def quarantine_of(run_id: str):
    return pads.dataset(str(store().root / QUARANTINE / f"{RUN_ID}={run_id}"), format="parquet").to_table()


@pytest.mark.parametrize("lookup", ["driver", "spark"])  # where the identity index is looked up ([raw] index_lookup)
def test_resent_payments_are_duplicates_never_late_and_later_nights_run(spark, state_dir, kafka_config, lookup):
    first = [payment(i, i) for i in range(30)]  # one a day, 2026-01-01 .. 2026-01-30
    send(kafka_config, kafka_config.transactions_topic, first)
    night1 = ingest(kafka_config, spark, index_lookup=lookup)
    assert night1.accounting[0].valid == 30
    # The row hashes the driver settled copies from serve their run only: gone once it committed.
    assert not store().run_hash_files(night1.run_id, Kind.TRANSACTION)

    # A payment switch resends a batch: old payments (3-4 weeks behind, beyond the lateness bound)
    # and recent ones, byte for byte; one genuinely new payment, and one new but late.
    send(kafka_config, kafka_config.transactions_topic,
         first[:10] + first[25:] + [payment(30, 30), payment("new-late", 1)])
    night2 = ingest(kafka_config, spark, index_lookup=lookup)
    acc = night2.accounting[0]
    assert (acc.read, acc.valid, acc.duplicates, acc.quarantined) == (17, 1, 15, {"late_event": 1})
    assert acc.read == acc.valid + acc.duplicates + acc.quarantined_total

    q = quarantine_of(night2.run_id).to_pandas()
    dups = q[q[REASON] == "duplicate"]
    assert sorted(dups["transaction_id"]) == sorted(f"t-{i}" for i in [*range(10), *range(25, 30)])
    assert sorted(dups["value"]) == sorted(first[:10] + first[25:])  # the bytes as resent
    t3 = dups[dups["transaction_id"] == "t-3"][DETAIL].item()
    assert t3 == (f"an identical copy of this event is in the raw store: "
                  f"transactions/event_date=2026-01-04/{RUN_ID}={night1.run_id}")
    assert q[q[REASON] == "late_event"]["transaction_id"].tolist() == ["t-new-late"]
    ids = stored()["transaction_id"].to_pylist()
    assert sorted(ids) == sorted(f"t-{i}" for i in range(31))

    # Every later night runs (the bug: every night after a resend failed the same way).
    send(kafka_config, kafka_config.transactions_topic, [payment(31, 31), first[29]])
    night3 = ingest(kafka_config, spark, index_lookup=lookup)
    assert [(a.valid, a.duplicates) for a in night3.accounting[:1]] == [(1, 1)]


def test_a_night_of_only_old_resends_is_all_duplicates(spark, state_dir, kafka_config):
    first = [payment(i, i) for i in range(20)]
    send(kafka_config, kafka_config.transactions_topic, first)
    ingest(kafka_config, spark)
    # Every record of the night is weeks behind the watermark: the read tasks keep none as valid.
    send(kafka_config, kafka_config.transactions_topic, first[:5] + first[:2])
    acc = ingest(kafka_config, spark).accounting[0]
    assert (acc.read, acc.valid, acc.duplicates, acc.quarantined) == (7, 0, 7, {})


def test_a_different_payload_under_a_known_id_is_a_conflicting_duplicate_and_both_are_findable(
        spark, state_dir, kafka_config):
    send(kafka_config, kafka_config.transactions_topic, [payment("a", 0, amount=10.0), payment("z", 5)])
    night1 = ingest(kafka_config, spark)
    send(kafka_config, kafka_config.transactions_topic, [
        payment("a", 0, amount=99.0),  # the stored one differs
        payment("b", 5, amount=1.0), payment("b", 5, amount=2.0),  # two versions within the run
        payment("c", 5), payment("c", 5, note="unknown fields are not content"),
    ])
    night2 = ingest(kafka_config, spark)
    acc = night2.accounting[0]
    assert (acc.read, acc.valid, acc.duplicates, acc.quarantined) == (5, 2, 1, {"conflicting_duplicate": 2})

    raw = stored().to_pandas().set_index("transaction_id")
    assert raw.loc["t-a", "amount"] == 10.0 and raw.loc["t-b", "amount"] == 1.0  # the first copies stay
    q = quarantine_of(night2.run_id).to_pandas().set_index("transaction_id")
    assert json.loads(q.loc["t-a", "value"])["amount"] == 99.0
    assert q.loc["t-a", DETAIL] == (f"a different version of this event is in the raw store: "
                                    f"transactions/event_date=2026-01-01/{RUN_ID}={night1.run_id}")
    offset_of_b = int(raw.loc["t-b", "offset"])
    assert q.loc["t-b", DETAIL] == (f"a different version of this event came first in this run at "
                                    f"partition 0 offset {offset_of_b} (kept)")
    assert q.loc["t-b", REASON] == "conflicting_duplicate" and q.loc["t-c", REASON] == "duplicate"


def test_the_whole_window_twice_in_one_night_and_a_late_first_copy(spark, state_dir, kafka_config):
    window = [payment(i, i) for i in range(20)]
    late = payment("old", 1)  # behind the watermark of what precedes it: late, and so is its copy
    send(kafka_config, kafka_config.transactions_topic, window + window + [late, late])
    night = ingest(kafka_config, spark)
    acc = night.accounting[0]
    assert (acc.read, acc.valid, acc.duplicates, acc.quarantined) == (42, 20, 21, {"late_event": 1})
    q = quarantine_of(night.run_id).to_pandas()
    old = q[q["transaction_id"] == "t-old"].sort_values("offset")
    assert old[REASON].tolist() == ["late_event", "duplicate"]
    assert old[DETAIL].iloc[1].endswith(f"offset {old['offset'].iloc[0]} (quarantined as late_event)")
    assert stored().num_rows == 20


def test_identical_copies_can_be_only_counted(spark, state_dir, kafka_config):
    batch = [payment(i, i) for i in range(5)]
    send(kafka_config, kafka_config.transactions_topic, batch + batch[:3] + [payment(0, 0, amount=3.0)])
    night = ingest(kafka_config, spark, quarantine_duplicates=False)
    acc = night.accounting[0]
    assert (acc.valid, acc.duplicates, acc.quarantined) == (5, 3, {"conflicting_duplicate": 1})
    q = quarantine_of(night.run_id)
    assert q[REASON].to_pylist() == ["conflicting_duplicate"]  # conflicting copies are always kept


def test_a_resent_report_is_a_duplicate_and_a_second_report_is_kept(spark, state_dir, kafka_config):
    send(kafka_config, kafka_config.transactions_topic, [payment(1, 0)])
    report = label(transaction_id="t-1", reported_at=at(3))
    send(kafka_config, kafka_config.labels_topic, [report])
    ingest(kafka_config, spark)
    send(kafka_config, kafka_config.labels_topic, [
        report,  # resent
        label(transaction_id="t-1", is_fraud=False, reported_at=at(9)),  # a clearing review: a new report
        label(transaction_id="t-1", reported_at=at(3), source="issuer_report"),  # same report, other content
    ])
    night = ingest(kafka_config, spark)
    labels = night.accounting[1]
    assert (labels.read, labels.valid, labels.duplicates, labels.quarantined, labels.orphan_labels) == (
        3, 1, 1, {"conflicting_duplicate": 1}, 0)
    assert stored(Kind.LABEL).num_rows == 2


def test_a_store_that_predates_the_index_gets_it_built_and_finds_its_duplicates(spark, state_dir, kafka_config):
    batch = [payment(i, i) for i in range(10)]
    send(kafka_config, kafka_config.transactions_topic, batch)
    ingest(kafka_config, spark)
    offsets = OffsetStore(store().root)
    legacy = json.loads(offsets.path.read_text())
    legacy.pop("index")
    offsets.path.write_text(json.dumps(legacy))
    for path in sorted((store().root / INDEX_DIR).rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()

    send(kafka_config, kafka_config.transactions_topic, batch[:4] + [payment(10, 10)])
    lines: list[str] = []
    night = ingest(kafka_config, spark, lines)
    assert any("identity_index_built=1" in line for line in lines)
    assert (night.accounting[0].valid, night.accounting[0].duplicates) == (1, 4)
    index = store().id_index(Kind.TRANSACTION)
    ids = stored()["transaction_id"]
    assert index.lookup(transaction_id_hashes(ids)).found.all() and len(ids) == 11


def test_a_run_killed_before_its_commit_leaves_the_index_as_committed(spark, state_dir, kafka_config, monkeypatch):
    send(kafka_config, kafka_config.transactions_topic, [payment(i, i) for i in range(6)])
    ingest(kafka_config, spark)
    before = store().committed()
    segments = sorted(p.name for p in (store().root / INDEX_DIR / "transactions").iterdir())

    send(kafka_config, kafka_config.transactions_topic, [payment(2, 2), payment(6, 6)])
    real_commit = OffsetStore.commit

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(OffsetStore, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest(kafka_config, spark)
    assert store().committed() == before
    assert len(list((store().root / INDEX_DIR / "transactions").iterdir())) > len(segments)  # written, unlisted
    assert not store().id_index(Kind.TRANSACTION).lookup(transaction_id_hashes(pa.array(["t-6"]))).found.any()

    monkeypatch.setattr(OffsetStore, "commit", real_commit)
    night = ingest(kafka_config, spark)
    assert (night.accounting[0].valid, night.accounting[0].duplicates) == (1, 1)
    live = store().committed().index["transactions"]
    assert sorted(p.name for p in (store().root / INDEX_DIR / "transactions").iterdir()) == sorted(live)


def _night_records(rng: random.Random, night: int, history: list[bytes]) -> list[bytes]:
    """One night's traffic: new payments over 3 days, resends of anything sent before (identical or
    changed), repeats within the night, and a few new payments far behind the watermark."""
    start = 3 * night
    new = [payment(f"{night}-{i}", start + rng.random() * 3) for i in range(40)]
    late = [payment(f"{night}-late-{i}", max(0.0, start - 8 - rng.random() * 5)) for i in range(3)] if night else []
    resent = rng.sample(history, min(len(history), 25))
    changed = [v.replace(b'"amount": 12.5', b'"amount": 13.5') for v in rng.sample(history, min(len(history), 5))]
    within = rng.sample(new, 8) + [new[0].replace(b'"amount": 12.5', b'"amount": 1.0')]
    records = new + late + resent + changed + within
    rng.shuffle(records)
    return records


# night -> where that night's first try dies: after the copies moved in the run's files, after the
# index segments were written (and merged), just before the commit, just after it (merged-away
# segments not yet deleted).
KILLED_AT = {1: (raw_ingest, "settle_copies", "after"), 2: (IdIndex, "with_run", "after"),
             3: (OffsetStore, "commit", "before"), 4: (OffsetStore, "commit", "after")}


def test_random_nights_of_resends_keep_the_first_copy_and_account_for_every_record(
        spark, state_dir, kafka_config, monkeypatch):
    """Property, over 6 nights (four killed at different stages and rerun): the store holds each id once, as its first
    accepted copy; each copy of a stored id is a duplicate when identical and conflicting when not,
    never late; each record sent is in exactly one place."""
    rng = random.Random(23)
    sent: list[bytes] = []
    for night in range(6):
        records = _night_records(rng, night, sent)
        send(kafka_config, kafka_config.transactions_topic, records)
        sent += records
        if night in KILLED_AT:  # the rerun reads the whole night again (or nothing, once committed)
            target, name, when = KILLED_AT[night]
            real = getattr(target, name)

            def then_killed(*args, _real=real, _when=when, **kwargs):
                if _when == "after":
                    _real(*args, **kwargs)
                raise SystemExit(137)

            monkeypatch.setattr(target, name, then_killed)
            with pytest.raises(SystemExit):
                ingest(kafka_config, spark)
            monkeypatch.setattr(target, name, real)
        ingest(kafka_config, spark)

    runs = store().committed().runs
    accounts = [json.loads((store().root / "_runs" / f"{run}.json").read_text())["accounting"][0] for run in runs]
    assert sum(a["read"] for a in accounts) == len(sent)
    assert all(a["read"] == a["valid"] + a["duplicates"] + a["quarantined_total"] for a in accounts)
    live = store().committed().index["transactions"]
    assert sorted(p.name for p in (store().root / INDEX_DIR / "transactions").iterdir()) == sorted(live)

    first_version = {}  # id -> the first copy sent (one partition: offset order is arrival order)
    for value in sent:
        first_version.setdefault(json.loads(value)["transaction_id"], value)
    raw = stored().to_pandas()
    assert raw["transaction_id"].is_unique
    for tid, payload in zip(raw["transaction_id"], raw["payload"], strict=True):
        assert payload.encode() == first_version[tid]

    q = pads.dataset(str(store().root / QUARANTINE), format="parquet", partitioning="hive").to_table()
    committed_runs = set(store().committed().runs)
    q = q.filter(pc.is_in(q[RUN_ID], pa.array(sorted(committed_runs)))).to_pandas()
    # Every Kafka position is in exactly one place.
    positions = Counter(zip(raw["offset"], strict=True)) + Counter(zip(q["offset"], strict=True))
    assert sorted(positions) == [(o,) for o in range(len(sent))] and max(positions.values()) == 1
    in_store = set(raw["transaction_id"])
    stored_payload = dict(zip(raw["transaction_id"], raw["payload"].map(str.encode), strict=True))
    copies_of_stored = q[q["transaction_id"].isin(in_store)]
    assert set(copies_of_stored[REASON]) <= {"duplicate", "conflicting_duplicate"}  # never late
    expected = np.where(copies_of_stored["value"].map(lambda v: v == stored_payload[json.loads(v)["transaction_id"]]),
                        "duplicate", "conflicting_duplicate")
    assert copies_of_stored[REASON].tolist() == expected.tolist()
    assert sum(a["duplicates"] for a in accounts) == int((q[REASON] == "duplicate").sum())
    assert sum(a["quarantined"].get("late_event", 0) for a in accounts) == int((q[REASON] == "late_event").sum()) > 0
