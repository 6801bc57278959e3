"""Cron expressions (UTC): 5 fields, 6 with seconds first, or ``@hourly``-style macros.

croniter (and python-dateutil under it) is imported on first use: a process without
schedules never loads it (``tests/unit/test_lazy_imports.py``)."""

from __future__ import annotations

from datetime import UTC, datetime

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


class CronError(ValueError):
    pass


def _is_seconds_form(expr: str) -> bool:
    return len(expr.split()) == 6


def validate_cron(expr: str) -> str:
    """The normalised expression, or CronError saying what is wrong."""
    expr = " ".join(expr.split())
    if expr.startswith("@"):
        if expr.lower() not in MACROS:
            raise CronError(f"unknown cron macro {expr!r}; use one of {', '.join(MACROS)}")
        expr = expr.lower()
    elif len(expr.split()) not in (5, 6):
        raise CronError(
            "a cron expression has 5 fields (minute hour day month weekday), or 6 with seconds first"
        )
    from croniter import croniter

    if not croniter.is_valid(expr, second_at_beginning=_is_seconds_form(expr)):
        raise CronError(f"invalid cron expression {expr!r}")
    try:
        next_after(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except Exception:
        raise CronError(f"cron expression {expr!r} never fires") from None
    return expr


def next_after(expr: str, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (UTC)."""
    from croniter import croniter

    it = croniter(expr, after.astimezone(UTC), second_at_beginning=_is_seconds_form(expr))
    nxt: datetime = it.get_next(datetime)
    return nxt.astimezone(UTC)
