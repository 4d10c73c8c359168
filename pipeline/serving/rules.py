"""Block and allow lists (card, merchant, device) from a file, refreshed without a restart.

File format (TOML; every table and key optional)::

    [block]
    card = ["card-00000042"]
    merchant = ["mer-000013"]
    device = []

    [allow]
    card = ["card-00000007"]

:func:`parse_rules` is pure (text -> :class:`RuleSet`, or :class:`RulesError` naming the key).
:class:`RuleBook` holds the rule set in force and swaps it whole on :meth:`RuleBook.refresh`: a
request sees the old set or the new one, never a mix. A file that cannot be read or parsed leaves
the current set in force and is reported (``last_error``, the failure counter); a missing file
means "no rules" (a fresh deployment has none yet).
"""

from __future__ import annotations

import hashlib
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Action = Literal["block", "allow"]
ACTIONS: tuple[Action, ...] = ("block", "allow")
SUBJECTS = ("card", "merchant", "device")


class RulesError(ValueError):
    """The rules file is not valid; the message names the file and key to fix."""


@dataclass(frozen=True)
class RuleHit:
    """One list entry that matched: ``blocklist:card=card-42`` in a decision's reasons."""

    action: Action
    subject: str  # "card" | "merchant" | "device"
    value: str

    def __str__(self) -> str:
        return f"{self.action}list:{self.subject}={self.value}"


@dataclass(frozen=True)
class RuleSet:
    """``lists[action][subject]`` is the set of ids on that list."""

    lists: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    digest: str = "empty"  # sha256 of the file's bytes (first 12 hex digits): which version is live

    def match(self, card_id: str, merchant_id: str, device_id: str | None) -> tuple[RuleHit, ...]:
        """Every entry that names this payment's card, merchant or device (block entries first)."""
        ids = {"card": card_id, "merchant": merchant_id, "device": device_id}
        return tuple(RuleHit(action, subject, ids[subject])  # type: ignore[arg-type]
                     for action in ACTIONS for subject in SUBJECTS
                     if ids[subject] is not None and ids[subject] in self.lists.get(action, {}).get(subject, ()))

    def counts(self) -> dict[str, int]:
        return {f"{a}.{s}": len(self.lists.get(a, {}).get(s, ())) for a in ACTIONS for s in SUBJECTS}


def parse_rules(data: bytes, source: str = "rules") -> RuleSet:
    """The rule set in ``data`` (TOML bytes); raises :class:`RulesError` naming what is wrong."""
    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RulesError(f"{source}: not valid UTF-8 TOML: {exc}") from exc
    unknown = sorted(set(table) - set(ACTIONS))
    if unknown:
        raise RulesError(f"{source}: unknown table [{unknown[0]}] (known: [block], [allow])")
    lists: dict[str, dict[str, frozenset[str]]] = {}
    for action in ACTIONS:
        section = table.get(action, {})
        if not isinstance(section, dict):
            raise RulesError(f"{source}: {action} must be a table")
        bad = sorted(set(section) - set(SUBJECTS))
        if bad:
            raise RulesError(f"{source}: unknown key {action}.{bad[0]} (known: {', '.join(SUBJECTS)})")
        lists[action] = {}
        for subject, values in section.items():
            if not isinstance(values, list) or not all(isinstance(v, str) and v.strip() for v in values):
                raise RulesError(f"{source}: {action}.{subject} must be a list of non-empty strings")
            lists[action][subject] = frozenset(values)
    return RuleSet(lists, hashlib.sha256(data).hexdigest()[:12])


@dataclass(frozen=True)
class RulesStatus:
    digest: str
    loaded_at: float | None  # epoch seconds of the last successful refresh
    refreshes: int
    failures: int
    last_error: str | None
    counts: dict[str, int]


class RuleBook:
    """The rule set in force, re-read from ``path`` on :meth:`refresh` (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._rules = RuleSet()
        self._lock = threading.Lock()  # serialises refreshes; readers take self._rules without it
        self._loaded_at: float | None = None
        self._refreshes = 0
        self._failures = 0
        self._last_error: str | None = None

    @property
    def rules(self) -> RuleSet:
        return self._rules

    def refresh(self) -> bool:
        """Re-read the file; ``True`` when the new set is in force, ``False`` when it was refused."""
        with self._lock:
            try:
                data = self.path.read_bytes() if self.path.exists() else b""
                rules = parse_rules(data, str(self.path)) if data else RuleSet()
            except (OSError, RulesError) as exc:
                self._failures += 1
                self._last_error = f"{type(exc).__name__}: {exc} (the previous rules stay in force)"
                return False
            self._rules = rules  # one reference swap: requests see the old set or the new one
            self._loaded_at = time.time()
            self._refreshes += 1
            self._last_error = None
            return True

    def status(self) -> RulesStatus:
        return RulesStatus(self._rules.digest, self._loaded_at, self._refreshes, self._failures,
                           self._last_error, self._rules.counts())
