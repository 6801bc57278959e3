"""What the state machines share (``flows/status.py``, ``queue/status.py``): the check of
a move against a machine's table of allowed moves, and the error of a refused one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


class IllegalMove(ValueError):
    """A move the table does not allow: a bug in the caller, never a client's error."""


@dataclass(frozen=True)
class Machine(Generic[S]):
    """A state machine's states and its table of allowed moves (each with who makes it)."""

    states: type[S]
    moves: Mapping[tuple[S, S], str]

    def check(self, frm: str, to: str) -> S:
        """``to`` as a member of ``states`` if ``frm`` → ``to`` is in ``moves``; else
        IllegalMove (an unknown state too)."""
        try:
            pair = (self.states(frm), self.states(to))
        except ValueError:
            raise IllegalMove(f"no {self.states.__name__} move from {frm!r} to {to!r}") from None
        if pair not in self.moves:
            raise IllegalMove(f"no {self.states.__name__} move from {frm} to {to}")
        return pair[1]
