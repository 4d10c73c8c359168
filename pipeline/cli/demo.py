"""``fraudctl demo``: what ``make demo`` runs."""

from __future__ import annotations

import click

from pipeline.cli.context import cli_context


@click.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Play the next night of the pipeline end to end on embedded defaults.

    Starts the embedded broker, simulates and publishes a night of payments and fraud reports,
    ingests them with Spark into a manifested dataset, trains with 2 DDP processes, registers the
    model in MLflow and gates it against the champion; the scoring service (fraudctl serve) follows
    the champion, reloading it when the gate promotes, and scores a few of the next day's payments;
    then the service and the broker are stopped. Run it again for the next night. Exit 0 whether the gate promoted or rejected the challenger; 1 if a stage failed.
    """
    from pipeline.demo.nights import load_demo_config
    from pipeline.demo.run import DemoFailed, run_demo

    env = cli_context(ctx).env
    try:
        run_demo(env, load_demo_config(env), click.echo)
    except DemoFailed as exc:
        raise click.ClickException(str(exc)) from exc
