"""Pydantic validation errors as our problems, with JSON paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowyard.errors import Problem


def _loc_to_field(loc: Sequence[Any]) -> str | None:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


def validation_problems(errors: Sequence[Any]) -> list[Problem]:
    problems = []
    for err in errors:
        field = _loc_to_field(err.get("loc", ()))
        msg = err.get("msg", "Invalid value.")
        problems.append(Problem(f"{field}: {msg}" if field else msg, field))
    return problems
