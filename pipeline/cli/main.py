"""``fraudctl``: the operator's entry point to the fraud pipeline.

Exit codes are the same for every command (0 success, 1 a failure the message explains, 2 usage
error, 3 the gate rejected the challenger, 4 `monitor` found a degraded model, 5 `monitor`'s day
has no matured labels yet); the one table of them is README.md, "## Exit codes".

Every command module is imported here, so each keeps Spark, torch, MLflow and pandas out of its
module level and imports them in the command body: ``fraudctl --help`` and ``fraudctl broker status``
then answer in a fraction of a second instead of the ~9 s those imports cost
(tests/cli/test_main.py holds this).
"""

from __future__ import annotations

import click

from pipeline.cli.backtest import backtest
from pipeline.cli.bench import bench
from pipeline.cli.broker import broker
from pipeline.cli.context import CliContext
from pipeline.cli.demo import demo
from pipeline.cli.ingest import ingest
from pipeline.cli.monitor import monitor
from pipeline.cli.nightly import nightly
from pipeline.cli.produce import produce
from pipeline.cli.registry import registry_commands
from pipeline.cli.serve import consistency, route, serve
from pipeline.cli.simulate import simulate_command
from pipeline.cli.train import train
from pipeline.config import DEFAULT_ENV, ENV_VAR_CONF_ENV


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--env", envvar=ENV_VAR_CONF_ENV, default=DEFAULT_ENV, show_default=True,
              help=f"Config environment: reads conf/<env>/*.toml (also ${ENV_VAR_CONF_ENV}).")
@click.pass_context
def cli(ctx: click.Context, env: str) -> None:
    """Card-payment fraud pipeline: Kafka -> Spark -> DDP training -> MLflow gate.

    Exit codes: 0 success, 1 failure (the message says what to do), 2 usage error,
    3 `promote` rejected the challenger, 4 `monitor` found a degraded model,
    5 `monitor`'s day has no matured labels yet.
    """
    ctx.obj = CliContext(env=env)


cli.add_command(backtest)
cli.add_command(broker)
cli.add_command(bench)
cli.add_command(demo)
cli.add_command(ingest)
cli.add_command(monitor)
cli.add_command(nightly)
cli.add_command(simulate_command)
cli.add_command(produce)
cli.add_command(train)
cli.add_command(serve)
cli.add_command(route)
cli.add_command(consistency)
for command in registry_commands:
    cli.add_command(command)
