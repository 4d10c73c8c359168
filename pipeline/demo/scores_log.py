"""The scores topic across demos: what the service decided live, kept as a long-lived cluster would.

The embedded broker keeps its log in memory and every ``make demo`` starts a fresh one; the
transactions and labels are replayed from the simulator (:mod:`pipeline.demo.nights`), but the
service's decisions cannot be re-simulated. So the demo saves the scores topic when a night ends
(before the broker stops) and publishes it back, byte for byte and in the same order (the same
keys, so the same partitions), before the next night's cycle, whose monitor stage reads it once a
live day's fraud reports have matured.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from pipeline.atomic import atomic_path
from pipeline.demo.dirty import publish_raw
from pipeline.kafka.admin import create_topics
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig


def _encode(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def save_scores(kafka: KafkaConfig, topic: str, path: Path) -> int:
    """Every record of ``topic`` (partition order, then offset) as JSON lines at ``path``; the count.
    Written atomically: a demo killed mid-save keeps the previous log."""
    records = read_topic(kafka, topic)
    with atomic_path(path) as tmp:
        with tmp.open("w") as out:
            for record in records:
                out.write(json.dumps({"key": _encode(record.key), "value": _encode(record.value)}) + "\n")
    return len(records)


def replay_scores(kafka: KafkaConfig, topic: str, path: Path) -> int:
    """Create ``topic`` and publish the saved records back into it; the count (0 without a log).
    Raises KafkaUnavailable when the broker does not acknowledge every record."""
    create_topics(kafka, (topic,), kafka.partitions)
    if not path.is_file():
        return 0
    messages = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        messages.append((base64.b64decode(record["key"]) if record["key"] else None,
                         base64.b64decode(record["value"]) if record["value"] else None))
    return publish_raw(kafka, topic, messages) if messages else 0
