"""The demo's notion of time: a sequence of simulated "nights", each adding a window of payments.

The embedded broker keeps its log in memory, so every ``make demo`` starts with empty topics.
To behave like a long-lived cluster, the demo replays the nights already played (byte-identical:
same records, same keys, same order, so the same partitions and offsets) before publishing the
new night; ingest's committed offsets from earlier nights then point exactly at where the new
records start. Fraud reports are published on the night they are *reported*, never earlier:
a report made after a night's cut-off waits for a later night, as it would in production.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pandas as pd

from pipeline.atomic import write_json_atomic
from pipeline.config import load_section
from pipeline.simulation import Simulation, SimulationConfig, simulate


@dataclass(frozen=True)
class DemoConfig:
    """``conf/<env>/demo.toml``: how big the demo's nights are."""

    num_cards: int = 4000
    num_merchants: int = 800
    first_night_days: int = 35  # history the first night brings: train + validation + gap + test + label maturity
    days_per_night: int = 1  # each later `make demo` adds this many days ("a new night of data")
    train_processes: int = 2
    dirty_records_per_night: int = 12  # malformed / invalid / duplicate records mixed into each night


def load_demo_config(env: str | None = None) -> DemoConfig:
    return load_section(DemoConfig, "demo", env)


@dataclass(frozen=True)
class Night:
    index: int
    start: date  # first simulated day of this night's window
    days: int

    @property
    def run_date(self) -> date:
        """The night's ingest run date: its last simulated day (labels reported by its end count)."""
        return self.start + timedelta(days=self.days - 1)

    @property
    def cutoff(self) -> datetime:
        """Reports made before this instant are published on this night (or earlier)."""
        return datetime.combine(self.run_date + timedelta(days=1), time(0), tzinfo=UTC)


def plan_nights(first_start: date, played: int, config: DemoConfig) -> list[Night]:
    """The ``played`` nights already published plus the next one, in order."""
    nights = [Night(0, first_start, config.first_night_days)]
    for i in range(1, played + 1):
        prev = nights[-1]
        nights.append(Night(i, prev.start + timedelta(days=prev.days), config.days_per_night))
    return nights


def simulate_night(night: Night, base: SimulationConfig, demo: DemoConfig) -> Simulation:
    config = dataclasses.replace(base, start_date=night.start.isoformat(), days=night.days,
                                 num_cards=demo.num_cards, num_merchants=demo.num_merchants)
    return simulate(config)


def labels_published_on(night: Night, previous: Night | None, sims: list[Simulation]) -> pd.DataFrame:
    """Reports (from any window simulated so far) made in ``(previous.cutoff, night.cutoff]``."""
    frames = []
    for sim in sims:
        reported = pd.to_datetime(sim.labels["reported_at"], utc=True, format="ISO8601")
        after = reported >= previous.cutoff if previous else pd.Series(True, index=reported.index)
        frames.append(sim.labels[after & (reported < night.cutoff)])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_played(state: Path) -> int:
    """How many nights earlier demos published and ingested."""
    path = state / "demo" / "nights.json"
    return json.loads(path.read_text())["played"] if path.is_file() else 0


def save_played(state: Path, played: int) -> None:
    write_json_atomic(state / "demo" / "nights.json", {"played": played})
