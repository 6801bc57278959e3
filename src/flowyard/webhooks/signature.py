"""The webhook's signature: ``X-Flowyard-Signature``, checked by the acceptance in the queue
(``queue/accept.py``) through the hook ``check`` that ``app.py`` passes in at start-up."""

from __future__ import annotations

import hashlib
import hmac

from flowyard.errors import Unauthorized

SIGNATURE_HEADER = "x-flowyard-signature"
_HEX = frozenset("0123456789abcdef")
_MAX_SIGNATURE_HEADER = 1024
SIGNATURE_FORMAT = 't=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + raw body>'


def signature_problem(
    secret: str, raw: bytes, header: str | None, *, now: float, tolerance: float
) -> str | None:
    """Why ``X-Flowyard-Signature`` does not authenticate ``raw``, or None when it does.

    Format (after Stripe): ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>``;
    several ``v1`` may be given (secret rotation), other schemes are ignored. Total:
    never raises, whatever the header holds.
    """
    if not header:
        return "is missing"
    if len(header) > _MAX_SIGNATURE_HEADER or not header.isascii():
        return "is malformed"
    timestamp: str | None = None
    candidates: list[str] = []
    for item in header.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            return "is malformed"
        if key == "t":
            if timestamp is not None or not value.isdigit() or len(value) > 12:
                return "is malformed"
            timestamp = value
        elif key == "v1":
            digest = value.lower()
            if len(digest) != 64 or not _HEX.issuperset(digest):
                return "is malformed"
            candidates.append(digest)
    if timestamp is None or not candidates:
        return "is malformed"
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
    matched = False
    for candidate in candidates:  # compare with all of them: the time taken tells nothing
        matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        return "does not match"
    if abs(now - int(timestamp)) > tolerance:
        return f"timestamp is more than {tolerance:g} s from now"
    return None


def signature_header(secret: str, raw: bytes, timestamp: int) -> str:
    """A valid header for ``raw`` (for senders and tests)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def check(secret: str, raw: bytes, header: str | None, now: float, tolerance: float) -> Unauthorized | None:
    """The acceptance's ``SignatureCheck``: the 401 for a request whose signature fails, or None."""
    problem = signature_problem(secret, raw, header, now=now, tolerance=tolerance)
    if problem is None:
        return None
    return Unauthorized(f"X-Flowyard-Signature {problem}; expected {SIGNATURE_FORMAT}.")
