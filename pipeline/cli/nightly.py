"""``fraudctl nightly``: one production night by hand, the same stages the fraud_nightly DAG runs."""

from __future__ import annotations

import click

from pipeline.cli.context import bootstrap_option, cli_context, parse_date
from pipeline.nightly.records import STAGES


@click.command()
@click.option("--run-date", required=True, callback=parse_date, metavar="YYYY-MM-DD",
              help="The night to run: the dataset's label cutoff (the day that just ended).")
@click.option("--stage", type=click.Choice(STAGES), default=None,
              help="Run only this stage; its input is the previous stage's record of the same night.")
@bootstrap_option
@click.pass_context
def nightly(ctx: click.Context, run_date, stage: str | None, bootstrap_servers: str | None) -> None:
    """Ingest -> train -> register -> gate -> monitor -> report for RUN_DATE.

    Each stage is idempotent: running the night again redoes only what is missing (the same
    dataset version, the finished run, the registered version, the recorded decision). Records go
    to <state>/nightly/<run date>/. Exit 0 whether the gate promoted or rejected the challenger
    (the last line says which) and whether the monitor found the live model degraded (a finding of
    the night, not a failure); 1 when a stage failed (the message is the job's).
    """
    from pipeline.config import ConfigError
    from pipeline.nightly.cycle import CycleConfig, run_cycle, run_stage
    from pipeline.nightly.records import NightlyStageMissing
    from pipeline.nightly.stages import StageFailed

    try:
        config = CycleConfig.load(cli_context(ctx).env, bootstrap_servers)
        if stage is None:
            run_cycle(config, run_date, click.echo)
        else:
            run_stage(config, run_date, stage, click.echo)
    except (StageFailed, NightlyStageMissing, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
