"""Audit history of the registered model: every gate decision, promotion and rollback.

Storage choice: registered-model tags ``audit.000001``, ``audit.000002``, ... each holding one JSON
record. The history then lives *in the registry itself*: the same store, backups and access control
as the aliases it explains, and it works unchanged against a remote tracking server, where a side
table next to a local SQLite file would not exist. Writers append only while holding the registry
lock (:mod:`pipeline.registry.lock`), so sequence numbers never collide. Caveat: tags are editable by
anyone with write access to the model; this is an operator history, not a tamper-proof ledger.

:func:`format_history` is its printed form (``fraudctl history``).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
from dataclasses import asdict, dataclass

from mlflow import MlflowClient

from pipeline.decisions.operating_points import OperatingPoints
from pipeline.registry.store import model_exists

TAG_PREFIX = "audit."

PROMOTE = "promote"
REJECT = "reject"
ROLLBACK = "rollback"
ROLLBACK_TO_VERSION = "rollback-to-version"
ROLLBACK_FROM_CHECKPOINT = "rollback-from-checkpoint"


@dataclass(frozen=True)
class AuditRecord:
    time: str  # UTC, ISO 8601
    actor: str
    action: str  # one of the constants above
    from_version: int | None  # champion before (None: there was none)
    to_version: int | None  # champion after a move; the challenger for a rejection
    reason: str


def resolve_actor(explicit: str | None = None) -> str:
    """``--actor`` when given, else the login name ($USER / getpass), else ``unknown``."""
    if explicit:
        return explicit
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return os.environ.get("USER") or "unknown"


def new_record(action: str, actor: str, from_version: int | None, to_version: int | None,
               reason: str) -> AuditRecord:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return AuditRecord(time=now, actor=actor, action=action, from_version=from_version,
                       to_version=to_version, reason=reason)


def _sequence(key: str) -> int | None:
    suffix = key[len(TAG_PREFIX):]
    return int(suffix) if key.startswith(TAG_PREFIX) and suffix.isdigit() else None


def append_record(client: MlflowClient, model_name: str, record: AuditRecord) -> str:
    """Store ``record`` as the next ``audit.NNNNNN`` tag. Call only while holding the registry lock."""
    tags = client.get_registered_model(model_name).tags
    last = max((s for s in map(_sequence, tags) if s is not None), default=0)
    key = f"{TAG_PREFIX}{last + 1:06d}"
    client.set_registered_model_tag(model_name, key, json.dumps(asdict(record), sort_keys=True))
    return key


def read_history(client: MlflowClient, model_name: str) -> list[AuditRecord]:
    """All records, oldest first; empty when the model was never registered."""
    if not model_exists(client, model_name):
        return []
    tags = client.get_registered_model(model_name).tags
    entries = sorted((s, v) for k, v in tags.items() if (s := _sequence(k)) is not None)
    return [AuditRecord(**json.loads(value)) for _, value in entries]


def format_history(model_name: str, aliases: dict[str, int | None], records: list[AuditRecord],
                   operating_points: dict[int, OperatingPoints | None] | None = None) -> str:
    """Current aliases, each aliased version's operating points (``operating_points``: by version),
    then one line per audit record (oldest first)."""
    current = "  ".join(f"{alias}=v{v}" if v else f"{alias}=-" for alias, v in aliases.items())
    lines = [f"{model_name}: {current}"]
    for version in dict.fromkeys(v for v in aliases.values() if v and operating_points is not None):
        points = operating_points.get(version)
        lines.append(f"  v{version}: {points.describe() if points else 'no operating points (decided with serving.toml thresholds)'}")
    lines.append(f"{'time':<26}{'actor':<14}{'action':<26}{'from':>6}{'to':>6}  reason")
    for r in records:
        lines.append(f"{r.time:<26}{r.actor[:13]:<14}{r.action:<26}{r.from_version or '-':>6}"
                     f"{r.to_version or '-':>6}  {r.reason}")
    return "\n".join(lines)
