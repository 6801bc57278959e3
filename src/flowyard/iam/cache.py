"""A short-lived in-process cache of resolved bearer tokens.

Resolving a token costs two queries, which on SQLite (one thread hop per
statement) is most of the cost of a small request. Entries live
``FLOWYARD_AUTH_CACHE_SECONDS`` (2 s); every IAM change made through this
process (logout, token deletion, user and role changes) clears the cache at
once, and other processes see such changes within that many seconds. An entry never outlives
the token's own expiry.
"""

from __future__ import annotations

import time
from datetime import datetime

from flowyard.clock import utcnow
from flowyard.iam.principal import Principal

_MAX_ENTRIES = 10_000


class PrincipalCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, key: str) -> Principal | None:
        if self.ttl <= 0:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._entries.pop(key, None)
            return None
        return entry[1]

    def put(self, key: str, principal: Principal, *, until: datetime | None = None) -> None:
        """Keep ``principal`` for ``ttl`` seconds, and never past ``until`` (the token's expiry)."""
        if self.ttl <= 0:
            return
        keep = self.ttl
        if until is not None:
            keep = min(keep, (until - utcnow()).total_seconds())
            if keep <= 0:
                return
        if len(self._entries) >= _MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + keep, principal)

    def clear(self) -> None:
        self._entries.clear()
