"""Which scoring partition owns a card: Kafka's default (Java) partitioner, defined once.

The ``transactions`` topic is keyed by ``card_id``. Our producers set librdkafka's
``partitioner = murmur2_random`` (:func:`pipeline.kafka.producer.producer_settings`), the Java
client's default, so a payment switch on the Java client and our producers put a card on the same
topic partition: ``toPositive(murmur2(utf8(card_id))) % topic_partitions`` (:func:`kafka_partition`,
Kafka's ``Utils.murmur2`` and ``Utils.toPositive``, tested against Kafka's and librdkafka's own
vectors and against where librdkafka puts keys on the real broker).

A tier of ``count`` service partitions splits the topic's partitions among them: service partition
``i`` owns topic partitions ``p`` with ``p % count == i`` and so the cards keyed onto them
(:class:`Ownership`). The service (``fraudctl serve --partition I/N``), the router
(:mod:`.router`) and the tests all call :meth:`Ownership.owner`; nothing else hashes a card.
A card therefore has one writer of its state, the partition that scores it; merchants are shared
by every partition, each following the whole topic. A request for a card a partition does not own
is refused with 421 naming the owner (:class:`Misdirected`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pipeline.config import ConfigError
from pipeline.serving.errors import RequestRefused

SEED = 0x9747B28C  # Kafka's Utils.murmur2 seed
M = 0x5BD1E995
R = 24
MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the signed 32-bit hash the Java client returns for ``data``.

    MurmurHash2 with Kafka's seed, 4-byte little-endian words, arithmetic modulo 2**32 (Java's int
    overflow), ``>>>`` as an unsigned shift."""
    length = len(data)
    h = (SEED ^ length) & MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * M) & MASK
        k ^= k >> R
        k = (k * M) & MASK
        h = ((h * M) & MASK) ^ k
    tail = length % 4
    if tail:  # Java's switch falls through: byte 2, then 1, then 0, then one multiply
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * M) & MASK
    h ^= h >> 13
    h = (h * M) & MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(key: bytes, partitions: int) -> int:
    """The topic partition of ``key``: ``Utils.toPositive(murmur2(key)) % partitions`` (the Java
    client's default partitioner and librdkafka's ``murmur2_random`` for a non-empty key)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@functools.lru_cache(maxsize=262_144)
def card_partition(card_id: str, partitions: int) -> int:
    """The ``transactions`` partition of a card (its key is the UTF-8 ``card_id``). Memoised: a
    card pays a few microseconds of pure-Python hashing once, then a dictionary look-up."""
    return kafka_partition(card_id.encode("utf-8"), partitions)


@dataclass(frozen=True)
class Ownership:
    """Service partition ``index`` of ``count``, over a ``transactions`` topic of ``topic_partitions``.

    ``addresses``: where each service partition listens (``host:port``, by index; empty when not
    configured), named in 421 answers so a client can go to the owner."""

    index: int
    count: int
    topic_partitions: int
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ConfigError(f"partition {self.index}/{self.count}: the index must be in 0..{self.count - 1}")
        if self.count > self.topic_partitions:
            raise ConfigError(f"{self.count} service partitions over a transactions topic of {self.topic_partitions} "
                              "partitions: some would own no card; use at most as many as the topic has")
        if self.addresses and len(self.addresses) != self.count:
            raise ConfigError(f"[partition] addresses names {len(self.addresses)} partitions, expected {self.count}")

    def owner(self, card_id: str) -> int:
        """The service partition that owns ``card_id``."""
        return card_partition(card_id, self.topic_partitions) % self.count

    def owns(self, card_id: str) -> bool:
        return self.count == 1 or self.owner(card_id) == self.index

    def topic_partitions_owned(self) -> list[int]:
        return [p for p in range(self.topic_partitions) if p % self.count == self.index]

    def address(self, index: int) -> str | None:
        return self.addresses[index] if self.addresses else None

    def check(self, card_ids: list[str]) -> None:
        """Raise :class:`Misdirected` for the first card this partition does not own."""
        if self.count == 1:
            return
        for i, card_id in enumerate(card_ids):
            owner = self.owner(card_id)
            if owner != self.index:
                raise Misdirected(self, card_id, owner, i)

    def status(self) -> dict[str, Any]:
        """For /health (the router reads it to check the tier's layout)."""
        return {"index": self.index, "count": self.count, "topic_partitions": self.topic_partitions,
                "owned_topic_partitions": self.topic_partitions_owned(), "addresses": list(self.addresses),
                "partitioner": "murmur2"}


# A partition checks a batch part here as POST /score/batch would, scoring and remembering nothing:
# the router's first pass over a batch split across partitions (all-or-nothing, router.py).
BATCH_CHECK_PATH = "/score/batch/check"

UNPARTITIONED_TOPIC = 1  # an unpartitioned service owns every card, whatever the topic's partitions


def unpartitioned() -> Ownership:
    return Ownership(0, 1, UNPARTITIONED_TOPIC)


class Misdirected(RequestRefused):
    """A payment of a card another service partition owns: 421 Misdirected Request, naming the owner
    (``owner.partition`` and, where configured, ``owner.address``). Nothing of the request was scored.
    ``index``: its position among the payments of the request."""

    def __init__(self, ownership: Ownership, card_id: str, owner: int, index: int = 0) -> None:
        address = ownership.address(owner)
        where = f" at {address}" if address else ""
        super().__init__(421, "misdirected", f"card {card_id!r} belongs to scoring partition {owner} of "
                         f"{ownership.count}{where}; this is partition {ownership.index}: send it there, or through "
                         "the router (fraudctl route)", "card_id")
        self.body["owner"] = {"partition": owner, "address": address}
        self.index = index

    def in_batch(self) -> Misdirected:
        """The same refusal naming the batch item (``index``), as batch refusals do."""
        self.body["index"] = self.index
        return self


def parse_partition(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)``; ConfigError naming the expected form otherwise."""
    index, sep, count = spec.partition("/")
    if not (sep and index.strip().isdigit() and count.strip().isdigit()) or not 0 <= int(index) < int(count):
        raise ConfigError(f"--partition {spec!r}: expected I/N with 0 <= I < N, e.g. 0/2")
    return int(index), int(count)
