"""Consecutive simulated windows as production sees them: payments, then reports as they are made.

A window's payments are published with the fraud reports made by its end (its cut-off), never
earlier: a report made after the cut-off belongs to the later window it falls in, which finds it by
re-simulating the earlier windows (same seed and options, so the same records). Used by
``fraudctl simulate --publish``, the demo's nights and the benchmarks' datasets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pandas as pd

from pipeline.simulation.config import SimulationConfig
from pipeline.simulation.simulator import Simulation, simulate


@dataclass(frozen=True)
class Window:
    index: int
    start: date  # first simulated day
    days: int

    @property
    def run_date(self) -> date:
        """The window's last simulated day: an ingest run on it counts the reports made by its end."""
        return self.start + timedelta(days=self.days - 1)

    @property
    def cutoff(self) -> datetime:
        """Reports made before this instant are published with this window (or earlier)."""
        return datetime.combine(self.run_date + timedelta(days=1), time(0), tzinfo=UTC)


def plan_windows(first_start: date, first_days: int, later: int, days_per_window: int) -> list[Window]:
    """A first window of ``first_days`` days, then ``later`` windows of ``days_per_window`` days each."""
    windows = [Window(0, first_start, first_days)]
    for i in range(1, later + 1):
        prev = windows[-1]
        windows.append(Window(i, prev.start + timedelta(days=prev.days), days_per_window))
    return windows


def simulate_window(window: Window, base: SimulationConfig, **overrides: object) -> Simulation:
    """``base`` (seed, mix, population) over the window's days, with any size ``overrides``."""
    return simulate(dataclasses.replace(base, start_date=window.start.isoformat(), days=window.days, **overrides))


def labels_published_on(window: Window, previous: Window | None, sims: list[Simulation]) -> pd.DataFrame:
    """Reports (from any window simulated so far) made in ``[previous.cutoff, window.cutoff)``."""
    frames = []
    for sim in sims:
        reported = pd.to_datetime(sim.labels["reported_at"], utc=True, format="ISO8601")
        after = reported >= previous.cutoff if previous else pd.Series(True, index=reported.index)
        frames.append(sim.labels[after & (reported < window.cutoff)])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
