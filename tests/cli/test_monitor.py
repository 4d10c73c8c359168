"""``fraudctl monitor``'s usage errors (the command against real components: tests/monitoring/test_monitor.py)."""

from __future__ import annotations

from click.testing import CliRunner

from pipeline.cli.main import cli


def test_a_date_that_is_not_a_date_is_a_usage_error():
    result = CliRunner().invoke(cli, ["monitor", "--date", "2026-02-31"])
    assert result.exit_code == 2 and "is not a date" in result.output


def test_the_date_is_required():
    result = CliRunner().invoke(cli, ["monitor"])
    assert result.exit_code == 2 and "--date" in result.output


def test_the_help_gives_the_exit_codes():
    result = CliRunner().invoke(cli, ["monitor", "--help"])
    assert result.exit_code == 0
    assert "4  degraded" in result.output and "5  the labels of DATE have not matured" in result.output
