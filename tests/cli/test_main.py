"""``fraudctl`` answers at once: importing the CLI loads no heavy library, and every command has --help."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from pipeline.cli.main import cli
from pipeline.config import PROJECT_ROOT

# Each costs from a few hundred ms to seconds to import; together they made `fraudctl --help` take ~9 s.
HEAVY = {"pyspark", "torch", "mlflow", "pandas", "sklearn", "lightgbm", "matplotlib"}


def test_importing_the_cli_loads_no_heavy_library() -> None:
    code = (f"import pipeline.cli.main, sys; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
    return paths


@pytest.mark.parametrize("path", _command_paths(cli), ids=" ".join)
def test_every_command_answers_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: cli {' '.join(path)} ")
