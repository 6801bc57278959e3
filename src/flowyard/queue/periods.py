"""Counting periods: UTC days, ISO weeks (named by their Monday) and calendar months (named
by their 1st), and the cover of a frame of days by whole months, then whole weeks, then
edge days. Pure date arithmetic, no database."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

DAY = "day"
WEEK = "week"
MONTH = "month"

# Ordinals (date.toordinal) and month numbers (year * 12 + month - 1) rather than dates while
# computing, so that a frame touching date.min or date.max never steps out of range.


def week_of(day: date) -> date:
    """The Monday of ``day``'s ISO week."""
    return date.fromordinal(day.toordinal() - day.weekday())


def month_of(day: date) -> date:
    """The 1st of ``day``'s calendar month."""
    return day.replace(day=1)


def rollups_of(day: date) -> tuple[tuple[str, date], tuple[str, date]]:
    """The rollup periods a day's count is added to: (period, its first day)."""
    return (WEEK, week_of(day)), (MONTH, month_of(day))


def _month_number(day: date) -> int:
    return day.year * 12 + day.month - 1


def _month_start(number: int) -> date:
    return date(number // 12, number % 12 + 1, 1)


def _month_number_after(day: date) -> int:
    """The number of the first month starting on or after ``day``."""
    return _month_number(day) + (day.day != 1)


def _month_number_ending_by(day: date) -> int:
    """The number of the last month ending on or before ``day``."""
    last_day = day.toordinal() + 1 == _next_month_ordinal(day)
    return _month_number(day) - (not last_day)


def _next_month_ordinal(day: date) -> int:
    n = _month_number(day) + 1
    if n // 12 > date.max.year:
        return date.max.toordinal() + 1
    return _month_start(n).toordinal()


@dataclass
class Cover:
    """A frame of days split into disjoint pieces, each an inclusive range of period starts:
    ``days`` of the daily counters, ``weeks`` (Mondays) and ``months`` (1sts) of the rollups.
    Together they hold every day of the frame exactly once."""

    days: list[tuple[date, date]] = field(default_factory=list)
    weeks: list[tuple[date, date]] = field(default_factory=list)
    months: list[tuple[date, date]] = field(default_factory=list)

    def count(self) -> int:
        """How many single periods (days, weeks, months) the cover holds."""
        return (
            sum(last.toordinal() - first.toordinal() + 1 for first, last in self.days)
            + sum((last.toordinal() - first.toordinal()) // 7 + 1 for first, last in self.weeks)
            + sum(_month_number(last) - _month_number(first) + 1 for first, last in self.months)
        )


def pieces(c: Cover) -> list[tuple[str, date]]:
    """Every single period of a cover, ``(DAY | WEEK | MONTH, its first day)``: days, then
    weeks, then months, each in order."""
    out = [
        (DAY, date.fromordinal(o))
        for first, last in c.days
        for o in range(first.toordinal(), last.toordinal() + 1)
    ]
    out += [
        (WEEK, date.fromordinal(o))
        for first, last in c.weeks
        for o in range(first.toordinal(), last.toordinal() + 1, 7)
    ]
    out += [
        (MONTH, _month_start(n))
        for first, last in c.months
        for n in range(_month_number(first), _month_number(last) + 1)
    ]
    return out


def months_touched(start: date, end: date) -> tuple[list[tuple[date, int]], tuple[date, date] | None]:
    """The calendar months ``start``..``end`` (inclusive) touches: those it holds only in part,
    each as (its 1st, a mask with bit ``i`` set for its ``i``-th day inside the frame, from
    0), and the range of the 1sts of the months it holds whole (None if none)."""
    if start > end:
        return [], None
    first_whole, last_whole = _month_number_after(start), _month_number_ending_by(end)
    partial: list[tuple[date, int]] = []
    if first_whole > last_whole:  # no whole month: one or two partial ones
        if _month_number(start) == _month_number(end):
            return [(month_of(start), _day_bits(start.day, end.day))], None
        last_of_start = date.fromordinal(_next_month_ordinal(start) - 1)
        return [
            (month_of(start), _day_bits(start.day, last_of_start.day)),
            (month_of(end), _day_bits(1, end.day)),
        ], None
    if start.day != 1:
        partial.append(
            (month_of(start), _day_bits(start.day, date.fromordinal(_next_month_ordinal(start) - 1).day))
        )
    if _month_number(end) > last_whole:
        partial.append((month_of(end), _day_bits(1, end.day)))
    return partial, (_month_start(first_whole), _month_start(last_whole))


def _day_bits(first: int, last: int) -> int:
    """Bits ``first - 1`` .. ``last - 1`` (days of a month, from 1)."""
    return ((1 << last) - 1) & ~((1 << (first - 1)) - 1)


def _cover_with_weeks(first: int, last: int, out: Cover) -> None:
    """Ordinals ``first``..``last`` (inclusive): whole ISO weeks, then the days at either edge."""
    if first > last:
        return
    week_first = first + (1 - first) % 7  # the first Monday on or after it (ordinal 1 is a Monday)
    sunday = last - last % 7  # the last Sunday on or before it
    if week_first > sunday - 6:
        out.days.append((date.fromordinal(first), date.fromordinal(last)))
        return
    if first < week_first:
        out.days.append((date.fromordinal(first), date.fromordinal(week_first - 1)))
    out.weeks.append((date.fromordinal(week_first), date.fromordinal(sunday - 6)))
    if sunday < last:
        out.days.append((date.fromordinal(sunday + 1), date.fromordinal(last)))


def cover(start: date, end: date) -> Cover:
    """Cover ``start``..``end`` (inclusive) by the whole calendar months inside it, then the
    whole ISO weeks inside what is left on either side, then the remaining edge days."""
    out = Cover()
    if start > end:
        return out
    first_month = _month_number_after(start)
    last_month = _month_number_ending_by(end)
    if first_month > last_month:
        _cover_with_weeks(start.toordinal(), end.toordinal(), out)
        return out
    month_from, month_to = _month_start(first_month), _month_start(last_month)
    _cover_with_weeks(start.toordinal(), month_from.toordinal() - 1, out)
    out.months.append((month_from, month_to))
    _cover_with_weeks(_next_month_ordinal(month_to), end.toordinal(), out)
    return out
