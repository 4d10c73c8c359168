"""What every ``fraudctl`` subcommand shares: the top-level options, common option types, the console.

Light on purpose: ``pipeline.cli.main`` imports every command module, so nothing here (or at the top
of a command module) may import Spark, torch, MLflow or pandas; commands import those when they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import click
from rich.console import Console

# Width of the console when stdout is not a terminal (a pipe, a log file, CI). There is no window to
# fit then, and rich's default of 80 columns would wrap or ellipsise table cells (topic names, reject
# reasons, actors) in exactly the output people grep and archive.
UNBOUNDED_WIDTH = 10_000


@dataclass(frozen=True)
class CliContext:
    env: str  # which conf/<env>/ directory to read


def cli_context(ctx: click.Context) -> CliContext:
    return ctx.find_object(CliContext)


def output_console() -> Console:
    """The console commands print through: fitted to the window on a terminal, never cut otherwise.

    Long plain lines are never wrapped either (``soft_wrap``), so one record stays on one line in logs.
    """
    console = Console(soft_wrap=True)
    # stdout itself, not console.is_terminal: that one is True under FORCE_COLOR (set by many CI
    # systems for colours), and the log would be cut to rich's fallback of 80 columns.
    if not _is_tty(console.file):
        console.width = UNBOUNDED_WIDTH
    return console


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # a stream without isatty, or a closed one
        return False


def parse_date(ctx: click.Context, param: click.Parameter, value: str | None) -> date | None:
    """Click callback: a ``YYYY-MM-DD`` option as a date; anything else is a usage error (exit 2)."""
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)") from None


def bootstrap_option(f):
    """``--bootstrap-servers`` (wins over $KAFKA_BOOTSTRAP_SERVERS and kafka.toml)."""
    return click.option("--bootstrap-servers", default=None, metavar="HOST:PORT[,...]",
                        help="Kafka bootstrap servers; overrides $KAFKA_BOOTSTRAP_SERVERS and conf/<env>/kafka.toml.")(f)
