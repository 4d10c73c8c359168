"""``fraudctl bench <name>``: run one benchmark (or ``all``) and write bench/results/<name>.json."""

from __future__ import annotations

import click

from pipeline.bench import BENCHMARKS, run_benchmark


def _help() -> str:
    lines = "\n".join(f"  {k}: {v}" for k, v in BENCHMARKS.items())
    return f"Measure NAME against its peer in the same run; writes bench/results/NAME.json.\n\n\b\n{lines}"


@click.command(help=_help())
@click.argument("name", type=click.Choice(sorted(BENCHMARKS) + ["all"]))
@click.option("--quick", is_flag=True, help="Smaller sizes, for a smoke run; figures are not comparable.")
def bench(name: str, quick: bool) -> None:
    names = sorted(BENCHMARKS) if name == "all" else [name]
    for n in names:
        click.echo(f"== bench {n}")
        out = run_benchmark(n, quick=quick)
        click.echo(out.read_text())
