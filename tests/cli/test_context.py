"""The CLI's console: tables reach logs and pipes whole, not cut to 80 columns."""

from __future__ import annotations

import re

import pytest

from pipeline.cli.context import output_console
from pipeline.contract import RejectReason
from pipeline.ingest.accounting import TopicAccounting
from pipeline.ingest.job import IngestReport
from pipeline.ingest.progress import print_summary


@pytest.fixture
def ci_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """FORCE_COLOR as CI systems set it (rich then claims a terminal) and an 80-column default."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.usefixtures("ci_environment")
def test_ingest_summary_keeps_long_topics_and_reasons_whole_when_not_a_terminal(
        capsys: pytest.CaptureFixture[str]) -> None:
    """capsys's stdout is what a pipe or a log file looks like: not a TTY."""
    topic = "transactions-" + "eu-west-1-card-present-payments-" * 5  # wider than any terminal default
    reasons = {r.value: 7 for r in (RejectReason.MALFORMED_JSON, RejectReason.NOT_AN_OBJECT,
                                    RejectReason.UNKNOWN_SCHEMA_VERSION, RejectReason.BAD_CURRENCY,
                                    RejectReason.FUTURE_EVENT_TIME)}
    accounting = TopicAccounting(topic=topic, kind="transaction", read=1_000_035, valid=1_000_000, duplicates=0,
                                 quarantined=reasons, offset_span=1_000_035)
    report = IngestReport(run_id="20261129T020000-0a1b2c", mode="raw", accounting=(accounting,), dataset=None,
                          run_manifest=None, stages=())

    print_summary(report, output_console())

    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # FORCE_COLOR: colours, yet no window
    assert "…" not in out
    [row] = [line for line in out.splitlines() if topic in line]
    assert "1000035" in row and "1000000" in row
    assert ", ".join(f"{r}=7" for r in reasons) in row
