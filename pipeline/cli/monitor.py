"""``fraudctl monitor --date D``: how the live model versions performed on the payments of day D.

Thin: load the slices (monitoring.toml, and the scores topic, raw store, label maturity and registry
of serving.toml, ingest.toml, registry.toml), call :func:`pipeline.monitoring.monitor.run_monitor`,
print. Exit codes (README.md, "## Exit codes"): 0 ok, insufficient evidence, unjudged or nothing to
monitor; 4 degraded; 5 the day's labels have not matured in the raw store yet; 1 an error.
"""

from __future__ import annotations

import json

import click

from pipeline.cli.context import bootstrap_option, cli_context, parse_date
from pipeline.config import ConfigError


@click.command()
@click.option("--date", "day", required=True, callback=parse_date, metavar="YYYY-MM-DD",
              help="The monitored day: payments of this event date, with the fraud reports made by "
                   "DATE + label_maturity_days.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json instead of the summary lines.")
@bootstrap_option
@click.pass_context
def monitor(ctx: click.Context, day, as_json: bool, bootstrap_servers: str | None) -> None:
    """Judge the live models on DATE: the scores topic's first decision per payment joined with the
    matured fraud reports; per model version AUC, AP, recall and precision at its operating points,
    alert rate vs its budget, score and feature PSI. Writes <state>/monitoring/DATE/report.json and
    report.png, logs the figures to each version's MLflow run (step: the date), and with
    auto_rollback in monitoring.toml rolls a degraded champion back (audited).

    \b
    Exit codes:
      0  ok, insufficient evidence, unjudged (no expectation), or nothing to monitor
      4  degraded: realised recall below expectation - margin for degraded_after_days judged days
      5  the labels of DATE have not matured in the raw store yet (nothing read or written)
      1  error (Kafka or MLflow unreachable, a config file invalid, another monitor running)
    """
    from pipeline.kafka.admin import KafkaUnavailable
    from pipeline.monitoring.config import load_monitoring_config
    from pipeline.monitoring.history import MonitoringStateError
    from pipeline.monitoring.monitor import LabelsNotMature, MonitorSources, run_monitor
    from pipeline.monitoring.report import EXIT_LABELS_NOT_MATURE, describe
    from pipeline.registry.errors import RegistryError

    env = cli_context(ctx).env
    try:
        report = run_monitor(day, load_monitoring_config(env), MonitorSources.load(env, bootstrap_servers))
    except LabelsNotMature as exc:
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(EXIT_LABELS_NOT_MATURE)
    except (ConfigError, KafkaUnavailable, RegistryError, MonitoringStateError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        for line in describe(report):
            click.echo(line)
    ctx.exit(report.exit_code)
