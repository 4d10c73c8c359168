"""A failed night is never skipped: the demo records why it stopped, says so on the next run and plays
the same night again, counting it as played only once its live day was scored.

The whole night runs for real in test_demo.py; here the night itself is replaced by one that fails (or
finishes) on demand, because what is under test is the bookkeeping around it."""

from __future__ import annotations

import json

import pytest

from pipeline.demo import run
from pipeline.demo.nights import DemoConfig, load_failure, load_played, save_played
from pipeline.demo.run import DemoFailed, run_demo


def test_a_failed_night_is_recorded_announced_and_played_again(state_dir, monkeypatch):
    attempts = []

    def night(env, demo, state, played, echo):
        attempts.append(played)
        if len(attempts) == 1:
            raise DemoFailed("stage 'scoring service: live payments of 2026-02-05' failed: POST /score/batch answered 422")
        save_played(state, played + 1)
        return "night report"

    monkeypatch.setattr(run, "_run_night", night)
    save_played(state_dir, 3)
    with pytest.raises(DemoFailed):
        run_demo("dev", DemoConfig(), echo=lambda line: None)
    assert load_played(state_dir) == 3  # night 4 did not finish: not counted
    assert "answered 422" in load_failure(state_dir)

    lines = []
    assert run_demo("dev", DemoConfig(), echo=lines.append) == "night report"
    assert attempts == [3, 3]  # the same night again, not the next one
    assert lines[0].startswith("!! night 4 did not finish when it was last played (stage 'scoring service: live "
                               "payments of 2026-02-05' failed: POST /score/batch answered 422); playing it again")
    assert load_played(state_dir) == 4 and load_failure(state_dir) is None
    assert json.loads((state_dir / "demo" / "nights.json").read_text()) == {"played": 4}


def test_a_demo_state_from_before_failures_were_recorded_reads_as_no_failure(state_dir):
    (state_dir / "demo").mkdir()
    (state_dir / "demo" / "nights.json").write_text('{"played": 2}')
    assert load_played(state_dir) == 2 and load_failure(state_dir) is None
