"""What every ``fraudctl`` subcommand receives from the top-level options."""

from __future__ import annotations

from dataclasses import dataclass

import click


@dataclass(frozen=True)
class CliContext:
    env: str  # which conf/<env>/ directory to read


def cli_context(ctx: click.Context) -> CliContext:
    return ctx.find_object(CliContext)


def bootstrap_option(f):
    """``--bootstrap-servers`` (wins over $KAFKA_BOOTSTRAP_SERVERS and kafka.toml)."""
    return click.option("--bootstrap-servers", default=None, metavar="HOST:PORT[,...]",
                        help="Kafka bootstrap servers; overrides $KAFKA_BOOTSTRAP_SERVERS and conf/<env>/kafka.toml.")(f)
