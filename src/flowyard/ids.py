"""Object ids: 24 lowercase hex characters, MongoDB ObjectId compatible (SPEC §1 "Ids").

4 bytes of creation time (seconds), then 8 bytes that this process keeps increasing
within a second: a random start below 2^63 at each new second, then a random step of
1 to 2^32 for each id. So ids made by one process sort in creation order (the default
list order is ``id`` ascending), ids of different processes sort by their second, and
the next id cannot be guessed from the last (the webhook address relies on that).

The second never goes backwards within a process (a clock stepped back keeps the last
second), and a counter that would overflow its 8 bytes moves on to the next second.
A forked child starts afresh, so parent and child never continue one sequence.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time

from flowyard.errors import InvalidInput

_ID_RE = re.compile(r"[0-9a-f]{24}")
# The same rule for the OpenAPI document (every {id} path parameter, id filters).
ID_PATTERN = "^[0-9a-f]{24}$"
_START_BELOW = 1 << 63
_MAX_STEP = 1 << 32
_COUNTER_LIMIT = 1 << 64


class _Sequence:
    """The per-process state: the last second used and the counter within it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.second = -1
        self.counter = 0

    def next(self, now: float) -> tuple[int, int]:
        with self.lock:
            second = int(now)
            if second > self.second:
                self.second, self.counter = second, secrets.randbelow(_START_BELOW)
            else:
                self.counter += 1 + secrets.randbelow(_MAX_STEP)
                if self.counter >= _COUNTER_LIMIT:
                    self.second, self.counter = self.second + 1, secrets.randbelow(_START_BELOW)
            return self.second, self.counter


_sequence = _Sequence()


def _after_fork() -> None:
    global _sequence
    _sequence = _Sequence()


os.register_at_fork(after_in_child=_after_fork)


def new_id(*, now: float | None = None) -> str:
    """A fresh id; ``now`` (epoch seconds) is for tests of the recipe."""
    second, counter = _sequence.next(time.time() if now is None else now)
    return second.to_bytes(4, "big").hex() + counter.to_bytes(8, "big").hex()


def is_valid_id(value: str) -> bool:
    # fullmatch: with match, "$" also accepts a trailing newline.
    return bool(_ID_RE.fullmatch(value))


def check_id(value: str, what: str) -> None:
    """A malformed id is a bad request (400), not an unknown object (404)."""
    if not is_valid_id(value):
        raise InvalidInput(f"Invalid {what} id {value[:64]!r}: expected 24 hex characters.", field="id")
