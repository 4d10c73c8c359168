"""``fraudctl ingest``: the Spark ingest job (same as ``spark-submit jobs/ingest.py``)."""

from __future__ import annotations

import click

from pipeline.cli.context import bootstrap_option, cli_context, output_console, parse_date


@click.command()
@click.option("--run-date", callback=parse_date, metavar="YYYY-MM-DD",
              help="Nightly: ingest new Kafka records, then build the dataset with this label cutoff.")
@click.option("--start", callback=parse_date, metavar="YYYY-MM-DD", help="Backfill: first date of the dataset.")
@click.option("--end", callback=parse_date, metavar="YYYY-MM-DD", help="Backfill: last date of the dataset.")
@click.option("--from-kafka", is_flag=True, help="Backfill: catch the raw store up from Kafka first.")
@click.option("--master", default=None, help="Spark master (local[2], local-cluster[2,1,1024], spark://host:7077); "
                                             "wins over $SPARK_MASTER and conf/<env>/ingest.toml.")
@click.option("--allow-data-loss", is_flag=True,
              help="Continue past offsets that retention deleted before they were ingested (recorded in the run manifest).")
@bootstrap_option
@click.pass_context
def ingest(ctx: click.Context, run_date, start, end, from_kafka: bool, master: str | None, allow_data_loss: bool,
           bootstrap_servers: str | None) -> None:
    """Kafka -> validated raw store -> point-in-time features -> sharded, manifested dataset.

    Prints one line per stage with its counts, then the accounting (read = valid + quarantined +
    duplicates per topic) and the dataset's splits. Exit 1 with a message when Kafka is
    unreachable, a topic is missing, offsets were lost, or the dates cannot make a dataset.
    """
    if (run_date is None) == (start is None):
        raise click.UsageError("give either --run-date (nightly) or --start and --end (backfill)")
    if start is not None and end is None:
        raise click.UsageError("--start needs --end")
    if run_date is not None and (end is not None or from_kafka):
        raise click.UsageError("--end and --from-kafka belong to a backfill (--start/--end)")
    from pipeline.ingest.job import failure_message, load_job_configs, run_backfill, run_nightly
    from pipeline.ingest.progress import Progress, print_summary

    progress = Progress(emit=click.echo)
    try:
        config, kafka = load_job_configs(cli_context(ctx).env, bootstrap_servers)
        if run_date is not None:
            report = run_nightly(config, kafka, run_date, allow_data_loss=allow_data_loss, master=master,
                                 progress=progress)
        else:
            report = run_backfill(config, kafka, start, end, from_kafka=from_kafka, allow_data_loss=allow_data_loss,
                                  master=master, progress=progress)
    except Exception as exc:  # noqa: BLE001 - expected failures become a ClickException (exit 1)
        message = failure_message(exc)
        if message is None:
            raise
        raise click.ClickException(message) from exc
    print_summary(report, output_console())
    note = latest_note(report.dataset)
    if note:
        click.echo(note)


def latest_note(dataset) -> str | None:
    """What to know when the dataset just published is not LATEST (an older range: LATEST never
    moves back, :func:`pipeline.datasets.manifest.publish_manifest`); None when it is."""
    from pipeline.datasets.manifest import latest_version

    latest = latest_version(dataset.root) if dataset is not None else None
    if latest is None or latest == dataset.version:
        return None
    return (f"LATEST stays {latest}, whose label cutoff is later than {dataset.label_cutoff}: training, promote and "
            f"evaluate read it by default; promote/evaluate --dataset-version {dataset.version} read this one")
