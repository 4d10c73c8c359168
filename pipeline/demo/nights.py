"""The demo's notion of time: a sequence of simulated "nights", each adding a window of payments.

The embedded broker keeps its log in memory, so every ``make demo`` starts with empty topics.
To behave like a long-lived cluster, the demo replays the nights already played (byte-identical:
same records, same keys, same order, so the same partitions and offsets) before publishing the
new night; ingest's committed offsets from earlier nights then point exactly at where the new
records start. Fraud reports are published on the night they are *reported*, never earlier:
a report made after a night's cut-off waits for a later night, as it would in production.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from pipeline.atomic import write_json_atomic
from pipeline.config import load_section
from pipeline.simulation import Simulation, SimulationConfig
from pipeline.simulation.windows import Window as Night
from pipeline.simulation.windows import labels_published_on, plan_windows, simulate_window

__all__ = ["DemoConfig", "Night", "labels_published_on", "load_demo_config", "load_failure", "load_played", "plan_nights",
           "save_played", "simulate_night"]


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


def plan_nights(first_start: date, played: int, config: DemoConfig) -> list[Night]:
    """The ``played`` nights already published plus the next one, in order."""
    return plan_windows(first_start, config.first_night_days, played, config.days_per_night)


def simulate_night(night: Night, base: SimulationConfig, demo: DemoConfig) -> Simulation:
    return simulate_window(night, base, num_cards=demo.num_cards, num_merchants=demo.num_merchants)


def load_played(state: Path) -> int:
    """How many nights earlier demos played to the end (their live day scored)."""
    path = state / "demo" / "nights.json"
    return json.loads(path.read_text())["played"] if path.is_file() else 0


def load_failure(state: Path) -> str | None:
    """Why the next night failed when it was last played (None: it was not tried, or it finished)."""
    path = state / "demo" / "nights.json"
    return json.loads(path.read_text()).get("failed") if path.is_file() else None


def save_played(state: Path, played: int, failure: str | None = None) -> None:
    """``played`` nights finished; ``failure``: why night ``played + 1`` stopped, told on the next run."""
    write_json_atomic(state / "demo" / "nights.json",
                      {"played": played} | ({"failed": failure} if failure is not None else {}))
