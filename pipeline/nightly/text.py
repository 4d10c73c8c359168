"""How a night's records read on a terminal and in a task log: one function per record, pure."""

from __future__ import annotations

from pipeline.nightly.records import (
    GateOutcome,
    MonitorOutcome,
    NightReport,
    PublishedDataset,
    RegisteredModel,
    TrainedRun,
)
from pipeline.training.progress import format_bytes

SHOWN_VALIDATION = (("auc_roc", "AUC"), ("average_precision", "AP"), ("recall_at_1pct_fpr", "recall@1%FPR"),
                    ("card_precision_at_100", "card P@100"))


def describe_dataset(dataset: PublishedDataset) -> list[str]:
    landed = "; ".join(f"{a.kind}s read {a.read}: {a.valid} valid, {a.quarantined} quarantined, "
                       f"{a.duplicates} duplicates"
                       + (f" ({a.conflicting_duplicates} conflicting, quarantined)" if a.conflicting_duplicates else "")
                       for a in dataset.landed)
    lines = [f"dataset {dataset.name}@{dataset.version}: {dataset.rows} rows, {dataset.frauds} frauds, "
             f"labels as of {dataset.label_cutoff}" + (" (already published: same bytes)" if dataset.reused else "")]
    return lines + ([f"Kafka: {landed}"] if landed else [])


def describe_run(run: TrainedRun) -> list[str]:
    metrics = "  ".join(f"{label} {run.best_metrics[key]:.4f}" for key, label in SHOWN_VALIDATION
                        if key in run.best_metrics)
    sent, dense = run.bytes_sent_total, run.bytes_dense_total
    return [
        f"run {run.run_dir}" + (" (finished earlier: not retrained)" if run.reused else f" ({run.wall_s:.0f}s)"),
        f"validation (best epoch {run.best_epoch}): {metrics}",
        f"gradients per rank: {format_bytes(sent)} sent instead of {format_bytes(dense)} dense "
        f"({dense / max(sent, 1):.0f}x less, {run.compression}, {run.world_size} processes)",
    ]


def describe_model(model: RegisteredModel) -> list[str]:
    return [f"registered {model.model_name} v{model.version} as challenger"]


def describe_gate(outcome: GateOutcome) -> list[str]:
    return outcome.text.splitlines()


def decision_line(outcome: GateOutcome) -> str:
    """The night's verdict in one line; a rejection is a normal outcome and says so."""
    champion = f"v{outcome.champion_version}" if outcome.champion_version else "none"
    if outcome.promoted:
        return f"decision: {outcome.outcome}: v{outcome.challenger_version} is champion"
    return (f"decision: rejected v{outcome.challenger_version} (a normal outcome; champion stays {champion}): "
            + "; ".join(outcome.reasons))


def describe_monitor(monitored: MonitorOutcome) -> list[str]:
    return monitored.text.splitlines()


def _figure(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def monitor_line(monitored: MonitorOutcome | None) -> str:
    """The monitored day in one line; a degraded model is a finding of a successful night and says so."""
    if monitored is None:
        return "monitor: not run (a night recorded before the monitor stage existed)"
    versions = "; ".join(f"v{v.version} {v.state} (recall {_figure(v.recall)} vs expected "
                         f"{_figure(v.expected_recall)}, {v.frauds} frauds in {v.rows} payments)"
                         for v in monitored.versions)
    line = f"monitor {monitored.monitored_date}: {monitored.state}" + (f": {versions}" if versions else "")
    if monitored.state == "degraded":
        line += f" (a finding, not a failure: `fraudctl monitor` would exit {monitored.exit_code})"
    return line + "".join(f"; auto_rollback {r}" for r in monitored.rollbacks)


def describe_night(night: NightReport) -> list[str]:
    return [f"night {night.run_date}", *describe_dataset(night.dataset), *describe_run(night.run),
            *describe_model(night.model), decision_line(night.gate), monitor_line(night.monitor)]
