"""Incident times are moved inside the window whole, not clipped onto its last instant."""

from __future__ import annotations

from datetime import date

import numpy as np

from pipeline.simulation.blocks import MS_PER_DAY, MS_PER_HOUR, Window, fit_in_window

WINDOW = Window.of(date(2026, 3, 2), 2)


def test_window_knows_its_calendar_days() -> None:
    assert WINDOW.days == 2
    assert WINDOW.start_day_ordinal == date(2026, 3, 2).toordinal()


def test_incidents_inside_stay_and_late_ones_move_back_keeping_their_spacing() -> None:
    end = WINDOW.end_ms
    time_ms = np.array([WINDOW.start_ms + 5, WINDOW.start_ms + 9, end - 2 * MS_PER_HOUR, end + MS_PER_HOUR,
                        end + 3 * MS_PER_HOUR])
    incident = np.array([0, 0, 1, 1, 1])
    fitted = fit_in_window(time_ms, incident, WINDOW)
    np.testing.assert_array_equal(fitted[:2], time_ms[:2])
    assert fitted[4] == end - 1
    np.testing.assert_array_equal(np.diff(fitted[2:]), np.diff(time_ms[2:]))


def test_an_incident_longer_than_the_window_is_squeezed_into_it() -> None:
    time_ms = WINDOW.start_ms + np.array([0, MS_PER_DAY, 3 * MS_PER_DAY])
    fitted = fit_in_window(time_ms, np.zeros(3, np.int64), WINDOW)
    assert fitted[0] == WINDOW.start_ms and fitted[-1] <= WINDOW.end_ms - 1
    assert (np.diff(fitted) > 0).all()
