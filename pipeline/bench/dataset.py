"""The simulated dataset the training benchmarks share: simulator -> Kafka -> Spark ingest.

Built once per size through the same path as production (embedded broker, the project's Kafka
data source, point-in-time features, manifested shards) and cached under
``<state>/bench/simulated-<size>``; later benchmark runs reuse the published version.
``$FRAUD_BENCH_DATASET`` points the benchmarks at any other dataset root instead.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import date
from pathlib import Path

from pipeline.datasets.manifest import ManifestError, load_manifest
from pipeline.demo.nights import DemoConfig, plan_nights
from pipeline.demo.run import publish_nights
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import run_nightly
from pipeline.ingest.progress import quiet
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.settings import load_kafka_config
from pipeline.paths import state_dir
from pipeline.simulation import load_simulation_config

BENCH_DATASET_ENV = "FRAUD_BENCH_DATASET"
# full: ~590k payments over 28 days (~420k rows in the 20 dataset days); quick: ~85k payments.
FULL = DemoConfig(num_cards=14_000, num_merchants=2_000, first_night_days=35, dirty_records_per_night=0)
QUICK = DemoConfig(num_cards=2_000, num_merchants=400, first_night_days=35, dirty_records_per_night=0)


def bench_dataset_root(quick: bool) -> tuple[Path, str]:
    """(dataset root, a sentence saying where it came from)."""
    explicit = os.environ.get(BENCH_DATASET_ENV)
    if explicit:
        return Path(explicit), f"${BENCH_DATASET_ENV}={explicit}"
    size = "quick" if quick else "full"
    workdir = state_dir() / "bench" / f"simulated-{size}"
    spec = QUICK if quick else FULL
    root = workdir / "dataset"
    try:
        load_manifest(root)
    except ManifestError:
        build_simulated_dataset(workdir, root, spec)
    return root, (f"simulator ({spec.num_cards} cards, {spec.first_night_days} days) -> Kafka -> Spark ingest, "
                  f"cached in {workdir}")


def build_simulated_dataset(workdir: Path, root: Path, spec: DemoConfig, env: str = "dev") -> Path:
    """Simulate one window, publish it to a fresh embedded broker, ingest it, publish the dataset."""
    base = load_simulation_config(env)
    night = plan_nights(date.fromisoformat(base.start_date), 0, spec)[-1]
    ingest = load_ingest_config(env)
    ingest = dataclasses.replace(
        ingest,
        raw=dataclasses.replace(ingest.raw, path=str(workdir / "raw")),
        dataset=dataclasses.replace(ingest.dataset, root=str(root), name=f"bench-{workdir.name}"),
    )
    with EmbeddedBroker("127.0.0.1", free_port(), workdir / "broker.log") as broker:
        broker.start()
        kafka = dataclasses.replace(load_kafka_config(env), bootstrap_servers=broker.bootstrap_servers)
        broker.create_topics(kafka.topics(), kafka.partitions)
        publish_nights(kafka, [night], base, spec, echo=lambda _line: None)
        run_nightly(ingest, kafka, night.run_date, progress=quiet())
    return root
