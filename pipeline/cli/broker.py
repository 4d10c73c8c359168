"""``fraudctl broker start|stop|status``: the embedded Tansu broker as a background daemon."""

from __future__ import annotations

import click

from pipeline.cli.context import cli_context
from pipeline.kafka.broker import BrokerError, broker_status, start_daemon, stop_daemon
from pipeline.kafka.settings import load_kafka_config
from pipeline.paths import state_dir


@click.group()
def broker() -> None:
    """Run the embedded Kafka broker (Tansu, in-memory) for the demo and local work."""


@broker.command()
@click.option("--host", default=None, help="Listen address (default from kafka.toml [embedded]; loopback).")
@click.option("--port", type=int, default=None, help="Listen port (default from kafka.toml [embedded]).")
@click.pass_context
def start(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Start the broker in the background and create the configured topics.

    Waits until it accepts connections. The pidfile and log live under the state directory.
    """
    kafka = load_kafka_config(cli_context(ctx).env)
    host = host or kafka.embedded.host
    port = port or kafka.embedded.port
    try:
        info = start_daemon(state_dir(), kafka, host, port, kafka.embedded.start_timeout_s)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"broker running: pid {info['pid']} on {host}:{port}; topics {', '.join(kafka.topics())} "
               f"({kafka.partitions} partitions); log {info['log']}")
    if f"{host}:{port}" != kafka.bootstrap_servers:
        click.echo(f"note: kafka.toml points at {kafka.bootstrap_servers}; pass --bootstrap-servers {host}:{port} "
                   f"or export KAFKA_BOOTSTRAP_SERVERS={host}:{port}")


@broker.command()
def stop() -> None:
    """Stop the broker this project started (and only that process)."""
    info = stop_daemon(state_dir())
    click.echo(f"stopped broker pid {info['pid']}" if info else "no broker started by this project is running")


@broker.command()
def status() -> None:
    """Say whether the project's broker runs, where, and its pid. Exit 1 if not running."""
    info = broker_status(state_dir())
    if not info:
        click.echo("not running")
        raise SystemExit(1)
    click.echo(f"running: pid {info['pid']} on {info['host']}:{info['port']} since {info['started_at']}; log {info['log']}")
