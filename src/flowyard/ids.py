"""Object ids: 24 lowercase hex characters, MongoDB ObjectId compatible.

4 bytes of creation time (seconds) then 8 random bytes, so ids sort by creation
time and cannot be guessed (the webhook address relies on that).
"""

from __future__ import annotations

import os
import re
import time

from flowyard.errors import InvalidInput

_ID_RE = re.compile(r"[0-9a-f]{24}")


def new_id() -> str:
    return int(time.time()).to_bytes(4, "big").hex() + os.urandom(8).hex()


def is_valid_id(value: str) -> bool:
    # fullmatch: with match, "$" also accepts a trailing newline.
    return bool(_ID_RE.fullmatch(value))


def check_id(value: str, what: str) -> None:
    """A malformed id is a bad request (400), not an unknown object (404)."""
    if not is_valid_id(value):
        raise InvalidInput(f"Invalid {what} id {value[:64]!r}: expected 24 hex characters.", field="id")
