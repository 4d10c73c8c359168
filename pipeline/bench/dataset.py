"""The simulated portfolios the training benchmarks share: simulator -> Kafka -> Spark ingest -> backtest.

One portfolio per simulation preset (``default``: conf/dev/simulation.toml; ``ecommerce``:
simulation.ecommerce.toml, another fraud mix and seed; ``highrisk``: simulation.highrisk.toml, ~4%
fraud moving week to week, mostly in per-card compromise windows of a few days) and size. Each goes
the production way: the simulator's window (payments and the fraud reports made by its end) is
published to a fresh embedded broker and landed in a raw store by the ingest job; the benchmark
dataset is then a backtest layout of :data:`LAYOUTS` built from that raw store by
:mod:`pipeline.backtest` (its test split is the protocol holdout every model is scored on):
``standard`` (:data:`BENCH_DAYS`, what every bench uses) or ``short`` (7 train days, 1 validation day:
the horizon a new fraud team starts with).

Every layout ends its validation on the same day, so all share the gap and the test week: the same test
rows, features and matured labels, judged by the same protocol. The protocol removes the cards known
compromised from the layout's own earlier days, so a short layout, knowing less, keeps a few more rows
(the standard holdout is a subset of the short one: default full 143,227 of 148,248 rows).

Cached under ``<state>/bench/<preset>-<size>/`` (one raw store, a dataset root per layout); later runs
reuse the raw store and the published datasets. ``$FRAUD_BENCH_DATASET`` points the benchmarks at any
other dataset root instead.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pandas as pd

from pipeline.backtest import BacktestData, BacktestSpec, build_backtest_data
from pipeline.contract import Kind
from pipeline.evaluation.holdout import load_holdout
from pipeline.evaluation.protocol import BacktestDays
from pipeline.file_lock import file_lock
from pipeline.ingest.config import IngestConfig, load_ingest_config
from pipeline.ingest.progress import quiet
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import load_kafka_config
from pipeline.paths import state_dir
from pipeline.simulation import SimulationConfig, load_simulation_config
from pipeline.simulation.windows import Window, labels_published_on, simulate_window

BENCH_DATASET_ENV = "FRAUD_BENCH_DATASET"
PRESETS = ("default", "ecommerce", "highrisk")
# Several validation days (a stable early-stopping signal), a gap of the dev label maturity, a week of test.
BENCH_DAYS = BacktestDays(train=14, validation=5, gap=7, test=7)
STANDARD = "standard"
# Issue 38: one week of history and one validation day (the public generator A's protocol), same gap and test.
LAYOUTS = {STANDARD: BENCH_DAYS, "short": BacktestDays(train=7, validation=1, gap=7, test=7)}
# The standard layout, then a gap more so the test week's labels mature inside the simulated window.
SIM_DAYS = BENCH_DAYS.train + BENCH_DAYS.validation + BENCH_DAYS.gap + BENCH_DAYS.test + BENCH_DAYS.gap


@dataclass(frozen=True)
class PortfolioSize:
    num_cards: int
    num_merchants: int


# full: ~0.85-1M payments over 40 days (~400k in the train days); quick: a smoke-test size.
FULL = PortfolioSize(num_cards=14_000, num_merchants=2_000)
QUICK = PortfolioSize(num_cards=2_000, num_merchants=400)


@dataclass(frozen=True)
class BenchPortfolio:
    name: str
    data: BacktestData
    truth: pd.DataFrame | None  # transaction_id, pattern: the simulator's truth (None for an external dataset)
    source: str  # a sentence saying where the data came from
    simulation: SimulationConfig | None = None  # what simulated its window (None for an external dataset)
    layout: str = STANDARD  # a key of LAYOUTS; "external" for $FRAUD_BENCH_DATASET


@dataclass(frozen=True)
class PortfolioPlan:
    """Where a portfolio's layout comes from: the simulated window landed in one raw store
    (``ingest.raw``, shared by every layout) and the backtest built from it into ``dataset_root``."""

    name: str
    workdir: Path
    window: Window
    spec: BacktestSpec
    ingest: IngestConfig
    dataset_root: Path


def portfolio_simulation(preset: str, withheld: str | None = None) -> SimulationConfig:
    """The preset's simulation config (conf/dev), with the ``withheld`` fraud pattern's share set to 0:
    a portfolio whose model never saw that pattern, for a preset that simulates every pattern."""
    base = load_simulation_config("dev", None if preset == PRESETS[0] else preset)
    if withheld is None:
        return base
    return dataclasses.replace(base, pattern_mix=dataclasses.replace(base.pattern_mix, **{withheld: 0.0}))


def layout_spec(window_start: date, layout: str = STANDARD) -> BacktestSpec:
    """The backtest of ``layout`` in a simulated window starting ``window_start``: validation ends on the
    standard layout's last validation day, so every layout has the standard gap and test week.

    Raises ValueError for a layout not in :data:`LAYOUTS`."""
    if layout not in LAYOUTS:
        raise ValueError(f"bench layout {layout!r}: choose from {', '.join(LAYOUTS)}")
    return BacktestSpec(window_start + timedelta(days=BENCH_DAYS.train + BENCH_DAYS.validation - 1), LAYOUTS[layout])


def plan_portfolio(quick: bool, preset: str | None = None, withheld: str | None = None,
                   layout: str = STANDARD) -> PortfolioPlan:
    """The :class:`PortfolioPlan` of a preset's portfolio in ``layout`` (see :func:`bench_portfolio`)."""
    preset = preset or PRESETS[0]
    name = preset if withheld is None else f"{preset}-without-{withheld}"
    workdir = state_dir() / "bench" / f"{name}-{'quick' if quick else 'full'}"
    window = Window(0, date.fromisoformat(portfolio_simulation(preset, withheld).start_date), SIM_DAYS)
    # The standard dataset keeps the root it always had, so existing caches stay valid.
    root = workdir / ("dataset" if layout == STANDARD else f"dataset-{layout}")
    return PortfolioPlan(name, workdir, window, layout_spec(window.start, layout), _ingest_config(workdir), root)


def bench_dataset_root(quick: bool, preset: str | None = None) -> tuple[Path, str]:
    """(dataset root, where it came from) of the preset's portfolio, or of ``$FRAUD_BENCH_DATASET``."""
    explicit = os.environ.get(BENCH_DATASET_ENV)
    if explicit:
        return Path(explicit), f"${BENCH_DATASET_ENV}={explicit}"
    portfolio = bench_portfolio(quick, preset)
    return portfolio.data.root, portfolio.source


def bench_portfolio(quick: bool, preset: str | None = None, withheld: str | None = None,
                    layout: str = STANDARD) -> BenchPortfolio:
    """The preset's portfolio in ``layout`` (a key of :data:`LAYOUTS`), built on first use (module
    docstring); with ``withheld``, the preset without that fraud pattern (:func:`portfolio_simulation`),
    named ``<preset>-without-<pattern>``. ``$FRAUD_BENCH_DATASET`` set: that dataset, whatever the
    layout asked (recorded as ``external``)."""
    explicit = os.environ.get(BENCH_DATASET_ENV)
    if explicit:
        root = Path(explicit)
        holdout = load_holdout(root)
        return BenchPortfolio(root.name, BacktestData(root, holdout.manifest.version, holdout), None,
                              f"${BENCH_DATASET_ENV}={explicit}", layout="external")
    preset = preset or PRESETS[0]
    plan = plan_portfolio(quick, preset, withheld, layout)
    size = QUICK if quick else FULL
    base = portfolio_simulation(preset, withheld)
    truth_path = plan.workdir / "truth.parquet"
    # Blocking: of two benchmarks started together, the second waits for the first's build and reuses it.
    with file_lock(plan.workdir.parent / f"{plan.workdir.name}.lock", blocking=True):
        if not truth_path.is_file():
            shutil.rmtree(plan.workdir, ignore_errors=True)  # an interrupted build: raw store and offsets start over
            sim = simulate_window(plan.window, base, num_cards=size.num_cards, num_merchants=size.num_merchants)
            _land(plan.workdir, plan.ingest, plan.window, sim)
            sim.truth[["transaction_id", "pattern"]].to_parquet(truth_path)  # last: marks the raw store complete
        data = build_backtest_data(plan.ingest, plan.spec, plan.dataset_root, progress=quiet())
    without = f", fraud pattern {withheld} withheld" if withheld else ""
    source = (f"simulator preset {preset} ({size.num_cards} cards, {SIM_DAYS} days, seed {base.seed}{without}) -> "
              f"Kafka -> Spark ingest -> backtest {plan.spec.name} ({layout} layout), cached in {plan.workdir}")
    return BenchPortfolio(plan.name, data, pd.read_parquet(truth_path), source, base, layout)


def _ingest_config(workdir: Path) -> IngestConfig:
    ingest = load_ingest_config("dev")
    return dataclasses.replace(ingest, raw=dataclasses.replace(ingest.raw, path=str(workdir / "raw")))


def _land(workdir: Path, config: IngestConfig, window: Window, sim) -> None:
    """Publish the window to a fresh embedded broker and land it in the raw store with the ingest job."""
    from pipeline.ingest.job import run_raw_ingest

    labels = labels_published_on(window, None, [sim])
    with EmbeddedBroker("127.0.0.1", free_port(), workdir / "broker.log") as broker:
        broker.start()
        kafka = dataclasses.replace(load_kafka_config("dev"), bootstrap_servers=broker.bootstrap_servers)
        broker.create_topics(kafka.topics(), kafka.partitions)
        for topic, kind, records in ((kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records()),
                                     (kafka.labels_topic, Kind.LABEL, labels.to_dict("records"))):
            report = publish_records(kafka, topic, kind, records)
            if not report.ok:
                raise RuntimeError(f"publishing the bench portfolio to {topic}: {report.failed} failed "
                                   f"({report.errors[:3]}); see {workdir / 'broker.log'}")
        run_raw_ingest(config, kafka, progress=quiet())
