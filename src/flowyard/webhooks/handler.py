"""The webhook request, independent of the web framework.

``POST /webhooks/{flowId}`` has one server, the ASGI fast path
(``webhooks/fastpath.py``), which hands the raw request here: ``parse`` is the
one place its headers, query and body are read and validated, ``handle`` stores
it and answers. The endpoint's OpenAPI description is ``webhooks/openapi.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson
import sqlalchemy as sa

from flowyard import jsonvalue
from flowyard.api.deps import is_json_content_type
from flowyard.components.builtins import reply_header_refusal
from flowyard.db.session import Database
from flowyard.errors import InvalidInput, Problem, UnsupportedMediaType, error_body
from flowyard.queue.accept import WebhookBatcher, WebhookRequest
from flowyard.queue.hub import CompletionHub
from flowyard.queue.models import Execution

MAX_WAIT = 60.0
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# The service frames the reply itself; a flow may not override that.
_RESERVED = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
    }
)


def reply_headers(raw: Any) -> dict[str, str]:
    """The headers a flow's respond node set that the reply policy allows
    (``builtins.reply_header_refusal``: flows saved before it get the same answer), minus
    framing headers and anything that is not a valid header (which would otherwise fail the
    reply after the fact)."""
    out: dict[str, str] = {}
    if not isinstance(raw, dict):
        return out
    for name, value in raw.items():
        name, value = str(name), str(value)
        if not _TOKEN.fullmatch(name) or name.lower() in _RESERVED:
            continue
        if reply_header_refusal(name, value) is not None:
            continue
        if any(c in value for c in "\r\n\x00") or not all(ord(c) < 256 for c in value):
            continue
        out[name] = value
    return out


@dataclass(frozen=True)
class WebhookCall:
    """A parsed and validated webhook request."""

    flow_id: str
    payload: Any
    raw: bytes
    wait: float | None
    idempotency_key: str | None
    signature: str | None


def parse(
    flow_id: str, headers: Iterable[tuple[bytes, bytes]], query_string: bytes, raw: bytes
) -> WebhookCall:
    """Read and validate a webhook request (ASGI headers, raw query string and body).

    Raises the refusal in the contract's shape: 400 for ``wait``, the body (not JSON, or
    nested deeper than ``jsonvalue.MAX_DEPTH``) or ``Idempotency-Key``, 415 for a content type
    other than JSON. No parser text goes back to the anonymous caller.
    """
    content_type = idempotency_key = signature = None
    for name, value in headers:
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"idempotency-key":
            idempotency_key = value.decode("latin-1")
        elif name == b"x-flowyard-signature":
            signature = value.decode("latin-1")
    wait = None
    if query_string:
        values = parse_qs(query_string.decode("latin-1")).get("wait")
        if values:
            wait = parse_wait(values[-1])
    if not is_json_content_type(content_type):
        raise UnsupportedMediaType()
    if not raw:
        raise InvalidInput("A JSON body is required.")
    try:
        payload = jsonvalue.loads(raw)
    except jsonvalue.TooDeep as exc:
        raise InvalidInput(f"The body {exc}.") from None
    except orjson.JSONDecodeError as exc:
        # Position only: no parser text goes back to an anonymous caller.
        raise InvalidInput(f"The body is not valid JSON (line {exc.lineno}, column {exc.colno}).") from None
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 255:
        raise InvalidInput("Idempotency-Key must be 1 to 255 characters.", field="Idempotency-Key")
    return WebhookCall(flow_id, payload, raw, wait, idempotency_key, signature)


def parse_wait(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_WAIT:  # also refuses nan and inf
        raise InvalidInput(
            f"wait must be a number of seconds above 0 and at most {MAX_WAIT:g}.", field="wait"
        )
    return value


async def handle(
    call: WebhookCall,
    *,
    db: Database,
    batcher: WebhookBatcher,
    hub: CompletionHub | None,
    poll: float = 1.0,
) -> Reply:
    """Store the trigger durably, then answer 202 (or, with ``wait``, the flow's reply)."""
    accepted = await batcher.submit(
        WebhookRequest(
            flow_id=call.flow_id,
            payload=call.payload,
            body_hash=hashlib.sha256(call.raw).hexdigest() if call.idempotency_key is not None else "",
            raw=call.raw,
            idempotency_key=call.idempotency_key,
            signature=call.signature,
        )
    )
    queued = Reply(
        202,
        {
            "data": {"executionId": accepted.execution_id, "flowId": accepted.flow_id, "status": "queued"},
            "meta": {},
        },
        {"Idempotent-Replayed": "true"} if accepted.replayed else {},
    )
    if call.wait is None:
        return queued
    # A replayed request may name an execution that finished long ago: read it first.
    finished = await wait_for_result(
        db, hub, accepted.execution_id, call.wait, poll=poll, read_first=accepted.replayed or hub is None
    )
    if finished is None:
        return queued
    status, result, _error = finished
    if status == "succeeded":
        result = result or {}
        if "reply" in result:
            reply = result["reply"]
            return Reply(
                int(reply.get("status", 200)),
                reply.get("body"),
                reply_headers(reply.get("headers")),
            )
        return Reply(200, result.get("data"))
    # The caller is anonymous: no error text (it could hold internal addresses, or serve as a
    # port-scan oracle). The details stay in the execution and its logs for the flow's owners.
    return Reply(502, error_body(502, [Problem(failed_message(accepted.execution_id, status))]))


def failed_message(execution_id: str, status: str) -> str:
    return f"Execution {execution_id} {status}; its details are in the execution and its logs."


async def wait_for_result(
    db: Database,
    hub: CompletionHub | None,
    execution_id: str,
    seconds: float,
    *,
    poll: float = 1.0,
    read_first: bool = True,
) -> tuple[str, Any, Any] | None:
    """Wait until the execution finished, or ``seconds`` passed (None).

    The hub completes the wait when the execution finishes, whichever process ran
    it (in-process, or through the cross-process notification), usually with the
    outcome itself: no database read. The row is read only when the notice did not
    carry the outcome, and every ``poll`` seconds as a backstop for a lost notice.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    fut = hub.register(execution_id) if hub is not None else None
    try:
        if read_first or fut is None:
            found = await _read_finished(db, execution_id)
            if found is not None:
                return found
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            if fut is None:
                await asyncio.sleep(min(poll, remaining))
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(poll, remaining)):
                        await asyncio.shield(fut)
                if fut.done() and (carried := fut.result()) is not None:
                    return carried
            found = await _read_finished(db, execution_id)
            if found is not None:
                return found
            if hub is not None and fut is not None and fut.done():
                # The notice was early (the row is not final: its outcome was dropped and the
                # execution re-queued): wait for the next one.
                hub.forget(execution_id)
                fut = hub.register(execution_id)
    finally:
        if hub is not None and fut is not None:
            hub.discard(execution_id, fut)


async def _read_finished(db: Database, execution_id: str) -> tuple[str, Any, Any] | None:
    async with db.read() as session:
        row = (
            await session.execute(
                sa.select(Execution.status, Execution.result, Execution.error).where(
                    Execution.id == execution_id
                )
            )
        ).first()
    if row is not None and row[0] in FINISHED:
        return row[0], row[1], row[2]
    return None
