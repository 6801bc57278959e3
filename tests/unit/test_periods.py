"""The cover of a frame by whole months, whole ISO weeks and edge days: exhaustively over
every frame within a stretch of dates that crosses year ends, a leap day and short months."""

from __future__ import annotations

import calendar
from datetime import date, timedelta

import pytest

from flowyard.queue import periods
from flowyard.queue.periods import cover, month_of, rollups_of, week_of

FIRST = date(2023, 12, 18)
LAST = date(2024, 3, 12)  # 86 days: two year-month boundaries, February 29, every weekday


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _expand(c: periods.Cover) -> list[date]:
    """Every day the cover reads, with repeats if a day is read twice."""
    out: list[date] = []
    for first, last in c.days:
        out += _days(first, last)
    for first, last in c.weeks:
        for monday in _days(first, last):
            if monday.weekday() == 0:
                out += _days(monday, monday + timedelta(days=6))
    for first, last in c.months:
        for first_day in _days(first, last):
            if first_day.day == 1:
                last_day = calendar.monthrange(first_day.year, first_day.month)[1]
                out += _days(first_day, first_day.replace(day=last_day))
    return out


def _whole_months(start: date, end: date) -> set[date]:
    """The 1sts of the calendar months lying wholly within start..end."""
    return {
        d
        for d in _days(start, end)
        if d.day == 1 and d.replace(day=calendar.monthrange(d.year, d.month)[1]) <= end
    }


def test_every_frame_is_covered_exactly_once_by_the_largest_periods() -> None:
    frames = 0
    for start in _days(FIRST, LAST):
        for end in _days(start, LAST):
            c = cover(start, end)
            # Exactly the frame's days, each once.
            assert sorted(_expand(c)) == _days(start, end), (start, end, c)
            # Ranges are well formed: weeks start on Mondays, months on the 1st.
            for first, last in c.weeks:
                assert first <= last and first.weekday() == 0 and last.weekday() == 0
            for first, last in c.months:
                assert first <= last and first.day == 1 and last.day == 1
            # Every whole month inside the frame is read as a month.
            months = {m for first, last in c.months for m in _days(first, last) if m.day == 1}
            assert months == _whole_months(start, end), (start, end, c)
            # Outside the months, every whole ISO week is read as a week: edge days number at
            # most 6 on either side of each run of weeks, and no run of days holds a whole week.
            for first, last in c.days:
                run = _days(first, last)
                assert not any(d.weekday() == 0 and d + timedelta(days=6) <= last for d in run), (
                    start,
                    end,
                    c,
                )
            # At most: days, weeks, days, months, days, weeks, days.
            assert len(c.days) <= 4 and len(c.weeks) <= 2 and len(c.months) <= 1
            frames += 1
    assert frames == 86 * 87 // 2


def _period_days(kind: str, first: date) -> list[date]:
    if kind == periods.DAY:
        return [first]
    if kind == periods.WEEK:
        return _days(first, first + timedelta(days=6))
    return _days(first, first.replace(day=calendar.monthrange(first.year, first.month)[1]))


def test_the_single_periods_of_a_cover_are_its_ranges_one_by_one() -> None:
    """``pieces`` lists every single day, week and month of a cover (the counts read a frame
    one period at a time), ``count`` says how many without listing them."""
    for start in _days(FIRST, LAST):
        for end in _days(start, LAST):
            c = cover(start, end)
            pieces = periods.pieces(c)
            assert c.count() == len(pieces), (start, end)
            assert sorted(d for kind, first in pieces for d in _period_days(kind, first)) == _days(start, end)
            assert all(first.weekday() == 0 for kind, first in pieces if kind == periods.WEEK)
            assert all(first.day == 1 for kind, first in pieces if kind == periods.MONTH)
    whole = cover(date.min, date.max)
    assert whole.count() == (9999 * 12) and periods.pieces(cover(date(9999, 12, 1), date.max)) == [
        (periods.MONTH, date(9999, 12, 1))
    ]


def test_the_months_a_frame_touches_hold_exactly_its_days() -> None:
    """``months_touched``: the months held in part, with the bits of the frame's days in them,
    and the range of whole months, together name every day of the frame once."""
    for start in _days(FIRST, LAST):
        for end in _days(start, LAST):
            partial, whole = periods.months_touched(start, end)
            named = [first + timedelta(days=i) for first, mask in partial for i in range(31) if mask >> i & 1]
            assert all(first.day == 1 and mask for first, mask in partial)
            if whole is not None:
                named += [d for m in _days(*whole) if m.day == 1 for d in _period_days(periods.MONTH, m)]
                assert set(_days(*whole)) & _whole_months(start, end) == _whole_months(start, end)
            assert sorted(named) == _days(start, end), (start, end, partial, whole)
    assert periods.months_touched(date(2024, 1, 2), date(2024, 1, 1)) == ([], None)
    assert periods.months_touched(date.min, date.max) == ([], (date.min, date(9999, 12, 1)))


def test_empty_frame_and_the_ends_of_the_calendar() -> None:
    assert cover(date(2024, 1, 2), date(2024, 1, 1)) == periods.Cover()
    for start, end in [
        (date.min, date.min),
        (date.min, date(1, 3, 15)),
        (date(9999, 11, 20), date.max),
        (date(9999, 12, 31), date.max),
    ]:
        assert sorted(_expand(cover(start, end))) == _days(start, end)
    whole = cover(date.min, date.max)
    assert whole.months == [(date.min, date(9999, 12, 1))] and whole.days == [] and whole.weeks == []


@pytest.mark.parametrize("day", _days(FIRST, LAST))
def test_a_day_rolls_up_into_its_iso_week_and_calendar_month(day: date) -> None:
    (w, monday), (m, first) = rollups_of(day)
    assert (w, m) == (periods.WEEK, periods.MONTH)
    assert monday == week_of(day) and first == month_of(day)
    assert monday.weekday() == 0 and 0 <= (day - monday).days < 7
    assert monday.isocalendar()[:2] == day.isocalendar()[:2]
    assert (first.year, first.month, first.day) == (day.year, day.month, 1)
