"""The simulated portfolios the training benchmarks share: simulator -> Kafka -> Spark ingest -> backtest.

One portfolio per simulation preset (``default``: conf/dev/simulation.toml; ``ecommerce``:
simulation.ecommerce.toml, another fraud mix and seed; ``highrisk``: simulation.highrisk.toml, ~4%
fraud moving week to week, mostly in per-card compromise windows of a few days) and size. Each goes
the production way: the simulator's window (payments and the fraud reports made by its end) is
published to a fresh embedded broker and landed in a raw store by the ingest job; the benchmark
dataset is then the backtest layout :data:`BENCH_DAYS` built from that raw store by :mod:`pipeline.backtest` (its test
split is the protocol holdout every model is scored on). Cached under
``<state>/bench/<preset>-<size>/``; later runs reuse the raw store and the published dataset.
``$FRAUD_BENCH_DATASET`` points the benchmarks at any other dataset root instead.
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


def portfolio_simulation(preset: str, withheld: str | None = None) -> SimulationConfig:
    """The preset's simulation config (conf/dev), with the ``withheld`` fraud pattern's share set to 0:
    a portfolio whose model never saw that pattern, for a preset that simulates every pattern."""
    base = load_simulation_config("dev", None if preset == PRESETS[0] else preset)
    if withheld is None:
        return base
    return dataclasses.replace(base, pattern_mix=dataclasses.replace(base.pattern_mix, **{withheld: 0.0}))


def bench_dataset_root(quick: bool, preset: str | None = None) -> tuple[Path, str]:
    """(dataset root, where it came from) of the preset's portfolio, or of ``$FRAUD_BENCH_DATASET``."""
    explicit = os.environ.get(BENCH_DATASET_ENV)
    if explicit:
        return Path(explicit), f"${BENCH_DATASET_ENV}={explicit}"
    portfolio = bench_portfolio(quick, preset)
    return portfolio.data.root, portfolio.source


def bench_portfolio(quick: bool, preset: str | None = None, withheld: str | None = None) -> BenchPortfolio:
    """The preset's portfolio, built on first use (module docstring); with ``withheld``, the preset
    without that fraud pattern (:func:`portfolio_simulation`), named ``<preset>-without-<pattern>``."""
    explicit = os.environ.get(BENCH_DATASET_ENV)
    if explicit:
        root = Path(explicit)
        holdout = load_holdout(root)
        return BenchPortfolio(root.name, BacktestData(root, holdout.manifest.version, holdout), None,
                              f"${BENCH_DATASET_ENV}={explicit}")
    preset = preset or PRESETS[0]
    size = QUICK if quick else FULL
    name = preset if withheld is None else f"{preset}-without-{withheld}"
    workdir = state_dir() / "bench" / f"{name}-{'quick' if quick else 'full'}"
    base = portfolio_simulation(preset, withheld)
    window = Window(0, date.fromisoformat(base.start_date), SIM_DAYS)
    spec = BacktestSpec(window.start + timedelta(days=BENCH_DAYS.train + BENCH_DAYS.validation - 1), BENCH_DAYS)
    config = _ingest_config(workdir)
    truth_path = workdir / "truth.parquet"
    # Blocking: of two benchmarks started together, the second waits for the first's build and reuses it.
    with file_lock(workdir.parent / f"{workdir.name}.lock", blocking=True):
        if not truth_path.is_file():
            shutil.rmtree(workdir, ignore_errors=True)  # an interrupted build: its raw store and offsets start over
            sim = simulate_window(window, base, num_cards=size.num_cards, num_merchants=size.num_merchants)
            _land(workdir, config, window, sim)
            sim.truth[["transaction_id", "pattern"]].to_parquet(truth_path)  # last: marks the raw store complete
        data = build_backtest_data(config, spec, workdir / "dataset", progress=quiet())
    without = f", fraud pattern {withheld} withheld" if withheld else ""
    source = (f"simulator preset {preset} ({size.num_cards} cards, {SIM_DAYS} days, seed {base.seed}{without}) -> "
              f"Kafka -> Spark ingest -> backtest {spec.name}, cached in {workdir}")
    return BenchPortfolio(name, data, pd.read_parquet(truth_path), source, base)


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
