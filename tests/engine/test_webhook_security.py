"""Webhooks leak nothing: timestamped signatures, refusals that stay with their own
request, generic replies to anonymous callers, and the per-flow rate limit."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flowyard.clock import utcnow
from flowyard.config import Settings
from flowyard.db.session import Database
from flowyard.errors import Unauthorized
from flowyard.queue import pruner
from flowyard.queue.accept import Accepted, WebhookLimits, WebhookRequest, accept_batch
from flowyard.queue.models import Execution
from flowyard.queue.rate_buckets import WebhookRateBucket
from flowyard.webhooks import signature
from flowyard.webhooks.signature import signature_header, signature_problem
from tests.conftest import Account, flow_body
from tests.engine.test_engine_e2e import active_flow, finished
from tests.netfixtures import MakeClient, configured

__all__ = ["configured"]

SECRET = "s3cret-s3cret-s3cret"
BODY = b'{"order": 42}'
NOW = 1_800_000_000


def v1(secret: str, t: str, body: bytes) -> str:
    return hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256).hexdigest()


# -- the parser and checker (total: never raises) ------------------------------------


def check(header: str | None, *, now: float = NOW, body: bytes = BODY) -> str | None:
    return signature_problem(SECRET, body, header, now=now, tolerance=300)


def test_valid_signature() -> None:
    assert check(signature_header(SECRET, BODY, NOW)) is None
    assert check(f"t={NOW},v1={v1(SECRET, str(NOW), BODY).upper()}") is None
    assert check(f" t={NOW} , v1={v1(SECRET, str(NOW), BODY)} ") is None
    # The timestamp is signed as sent.
    assert check(f"t=0{NOW},v1={v1(SECRET, '0' + str(NOW), BODY)}") is None
    assert check(f"t=0{NOW},v1={v1(SECRET, str(NOW), BODY)}") == "does not match"


def test_tolerance_window_past_and_future() -> None:
    assert check(signature_header(SECRET, BODY, NOW - 300)) is None
    assert check(signature_header(SECRET, BODY, NOW + 300)) is None
    assert check(signature_header(SECRET, BODY, NOW - 301)) == "timestamp is more than 300 s from now"
    assert check(signature_header(SECRET, BODY, NOW + 301)) == "timestamp is more than 300 s from now"
    assert check(signature_header(SECRET, BODY, 0)) is not None


def test_rotation_accepts_any_listed_v1() -> None:
    old = v1("the-old-secret-0000", str(NOW), BODY)
    new = v1(SECRET, str(NOW), BODY)
    assert check(f"t={NOW},v1={old},v1={new}") is None
    assert check(f"t={NOW},v1={new},v1={old}") is None
    assert check(f"t={NOW},v1={old}") == "does not match"
    # Unknown schemes are ignored, as long as one v1 matches.
    assert check(f"t={NOW},v0=abc,v1={new}") is None


def test_wrong_body_or_secret_does_not_match() -> None:
    header = signature_header(SECRET, BODY, NOW)
    assert check(header, body=b'{"order": 43}') == "does not match"
    assert signature_problem("another-secret-00000", BODY, header, now=NOW, tolerance=300) == "does not match"


@pytest.mark.parametrize(
    "header",
    [
        "",
        None,
    ],
)
def test_missing(header: str | None) -> None:
    assert check(header) == "is missing"


GOOD = v1(SECRET, str(NOW), BODY)
MALFORMED = [
    "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest(),  # the old format
    GOOD,
    f"t={NOW}",
    f"v1={GOOD}",
    f"t={NOW},v1=",
    f"t={NOW},v1={GOOD[:-1]}",
    f"t={NOW},v1={GOOD}0",
    f"t={NOW},v1={GOOD[:-1]}g",
    f"t=,v1={GOOD}",
    f"t=-{NOW},v1={GOOD}",
    f"t={NOW}.5,v1={GOOD}",
    f"t=1e9,v1={GOOD}",
    f"t={NOW},t={NOW},v1={GOOD}",
    f"t={'9' * 40},v1={GOOD}",
    f"t={NOW};v1={GOOD}",
    f"t={NOW},,v1={GOOD}",
    ",,,",
    "=",
    "t=\x00,v1=\x00",
    "x" * 5000,
    f"t={NOW},v1={GOOD}," + "v1=" + "0" * 64 + ("," + "v1=" + "0" * 64) * 40,
]


@pytest.mark.parametrize("header", MALFORMED)
def test_malformed(header: str) -> None:
    assert check(header) == "is malformed"


@pytest.mark.parametrize(
    "header",
    [
        f"t={NOW},v1={GOOD[:-1]}é",
        f"t={NOW},v1={GOOD}\u2028",
        f"t=\uff11\uff18\uff10\uff10,v1={GOOD}",  # fullwidth digits: isdigit() would say yes
        f"t={NOW},v1={GOOD[:-2]}٣٣",
        "t=\udcff,v1=\udcff",
        "ÿ" * 64,
    ],
)
def test_non_ascii_is_malformed_not_an_error(header: str) -> None:
    assert check(header) == "is malformed"


# -- over HTTP -------------------------------------------------------------------------


def signed_flow() -> dict[str, Any]:
    return flow_body(webhookSecret=SECRET)


def post(c: httpx.AsyncClient, fid: str, header: bytes | str | None, body: bytes = BODY) -> Any:
    headers: dict[str, Any] = {"Content-Type": "application/json"}
    if header is not None:
        headers["X-Flowyard-Signature"] = header
    return c.post(f"/webhooks/{fid}", content=body, headers=headers)


async def test_signature_outcomes_over_http(configured: MakeClient, admin: Account, db: Database) -> None:
    c = await configured()
    fid = await active_flow(c, admin, signed_flow())
    now = int(time.time())
    cases: dict[str, tuple[bytes | str | None, str]] = {
        "missing": (None, "is missing"),
        "expired": (signature_header(SECRET, BODY, now - 600), "timestamp is more than 300 s"),
        "future": (signature_header(SECRET, BODY, now + 600), "timestamp is more than 300 s"),
        "malformed": ("t=abc,v1=xyz", "is malformed"),
        "old format": (
            "sha256=" + hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest(),
            "is malformed",
        ),
        "non-ascii": (f"t={now},v1=".encode() + "é".encode() * 32, "is malformed"),
        "latin-1": (b"t=\xff\xfe,v1=\xff", "is malformed"),
        "wrong": (signature_header("not-the-secret-0000", BODY, now), "does not match"),
    }
    for name, (header, reason) in cases.items():
        r = await post(c, fid, header)
        assert r.status_code == 401, (name, r.text)
        message = r.json()["errors"][0]["message"]
        assert message.startswith(f"X-Flowyard-Signature {reason}"), (name, message)
        assert "t=<unix seconds>,v1=" in message and SECRET not in message
    async with db.read() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Execution)) == 0
    r = await post(c, fid, signature_header(SECRET, BODY, now))
    assert r.status_code == 202, r.text


async def test_bad_signature_fails_alone_in_its_batch(
    configured: MakeClient, admin: Account, db: Database
) -> None:
    # A long group-commit window so that every concurrent request joins one batch.
    c = await configured(webhook_group_commit_ms=400)
    fid = await active_flow(c, admin, signed_flow())
    now = int(time.time())
    bad: list[bytes | str | None] = [
        f"t={now},v1=".encode() + "é".encode() * 32,  # made hmac.compare_digest raise before
        b"t=\xff,v1=\xff",
        "garbage",
        None,
        signature_header(SECRET, BODY, now - 3600),
    ]
    good = [signature_header(SECRET, BODY, now)] * 8
    headers = good[:4] + bad + good[4:]
    replies = await asyncio.gather(*(post(c, fid, h) for h in headers))
    codes = [r.status_code for r in replies]
    assert codes == [202] * 4 + [401] * len(bad) + [202] * 4, [r.text for r in replies]
    async with db.read() as session:
        stamps = (
            await session.scalars(sa.select(Execution.created_at).where(Execution.flow_id == fid))
        ).all()
    # One batch stamps all its executions with one time: the good requests on both sides of the
    # bad ones were committed together, so the bad ones were in that batch and failed alone.
    assert len(stamps) == 8 and len(set(stamps)) == 1, stamps


async def test_acceptance_without_a_signature_check_refuses_signed_flows(
    configured: MakeClient, admin: Account, db: Database
) -> None:
    """The signature check reaches the queue's acceptance as a hook (``WebhookLimits.verify``,
    passed in by app.py): without one, a webhook to a flow with a secret is refused, never
    stored unchecked; a broker event (no signature, its component as the trigger) is not."""
    c = await configured()
    fid = await active_flow(c, admin, signed_flow())
    now = int(time.time())

    def request(header: str | None, trigger: str = "webhook") -> WebhookRequest:
        return WebhookRequest(fid, {}, "h", BODY, None, header, trigger=trigger)

    signed = signature_header(SECRET, BODY, now)
    async with db.write() as session:
        bare = await accept_batch(session, [request(signed), request(None, trigger="amqp")], WebhookLimits())
    assert isinstance(bare[0], Unauthorized) and isinstance(bare[1], Accepted), bare
    app = c._transport.app  # type: ignore[attr-defined]
    checked = WebhookLimits(verify=signature.check, box=app.state.secret_box)
    async with db.write() as session:
        out = await accept_batch(session, [request(signed), request("garbage")], checked)
    assert isinstance(out[0], Accepted) and isinstance(out[1], Unauthorized), out
    assert await count_executions(db, fid) == 2


# -- generic replies to anonymous callers ------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_failed_synchronous_webhook_answers_generically(configured: MakeClient, admin: Account) -> None:
    c = await configured(http_allow_networks=["127.0.0.0/8"])
    port = closed_port()
    fid = await active_flow(
        c,
        admin,
        flow_body(
            graph={
                "nodes": [
                    {"id": "in", "componentId": "webhook"},
                    {"id": "call", "componentId": "http", "fields": {"url": f"http://127.0.0.1:{port}/x"}},
                ],
                "edges": [{"source": "in", "target": "call"}],
            }
        ),
    )
    r = await c.post(f"/webhooks/{fid}", params={"wait": 10}, json={})
    assert r.status_code == 502, r.text
    body = r.json()
    assert set(body) == {"errors"} and len(body["errors"]) == 1
    message = body["errors"][0]["message"]
    eid = message.split()[1]
    assert message == f"Execution {eid} failed; its details are in the execution and its logs."
    for leak in ("ConnectError", "127.0.0.1", str(port), "refused", "call", "http"):
        assert leak not in r.text, leak
    # The details are kept for the flow's owners.
    execution = await finished(c, admin, eid)
    assert "ConnectError" in execution["error"] and f"127.0.0.1:{port}" in execution["error"]


async def test_invalid_json_reply_carries_no_parser_text(configured: MakeClient, admin: Account) -> None:
    c = await configured()
    fid = await active_flow(c, admin, flow_body())
    r = await c.post(f"/webhooks/{fid}", content=b'{"a": tru', headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["errors"][0]["message"] == "The body is not valid JSON (line 1, column 10)."


# -- per-flow rate limit -----------------------------------------------------------------


async def count_executions(db: Database, fid: str) -> int:
    async with db.read() as session:
        return int(
            await session.scalar(
                sa.select(sa.func.count()).select_from(Execution).where(Execution.flow_id == fid)
            )
            or 0
        )


async def test_rate_limit_answers_429_with_retry_after(
    configured: MakeClient, admin: Account, db: Database
) -> None:
    c = await configured(webhook_rate_limit=1.0, webhook_rate_burst=3, webhook_group_commit_ms=50)
    fid = await active_flow(c, admin, flow_body())
    other = await active_flow(c, admin, flow_body(name="other"))
    replies = await asyncio.gather(*(c.post(f"/webhooks/{fid}", json={"n": i}) for i in range(7)))
    codes = sorted(r.status_code for r in replies)
    assert codes == [202] * 3 + [429] * 4, [r.text for r in replies]
    for r in replies:
        if r.status_code == 429:
            assert r.json() == {
                "errors": [
                    {
                        "message": f"Flow {fid} receives at most 1 webhooks per second; retry later.",
                        "code": 429,
                    }
                ]
            }
            assert r.headers["Retry-After"] == "1"
    assert await count_executions(db, fid) == 3  # nothing stored for the refused ones
    # Another flow has its own budget.
    assert (await c.post(f"/webhooks/{other}", json={})).status_code == 202
    # Retry-After is honest: after it, one more is accepted.
    await asyncio.sleep(1.2)
    assert (await c.post(f"/webhooks/{fid}", json={})).status_code == 202
    assert await count_executions(db, fid) == 4


async def test_rate_limit_is_on_by_default(configured: MakeClient, admin: Account, db: Database) -> None:
    """Attack (issue 17): no flow is left without a webhook budget. The default is generous
    (docs/configuration.md: above what one service can accept for one flow), so ordinary
    traffic passes; a flow whose bucket is empty is answered 429 with Retry-After."""
    defaults = Settings()
    assert defaults.webhook_rate_limit == 5000 and defaults.webhook_burst() == 5000
    c = await configured()
    fid = await active_flow(c, admin, flow_body())
    replies = await asyncio.gather(*(c.post(f"/webhooks/{fid}", json={}) for _ in range(20)))
    assert {r.status_code for r in replies} == {202}
    async with db.write() as session:
        drained = await session.execute(
            # Empty, and refilled "now" for the next hour: as if a flood had just taken every token.
            sa.update(WebhookRateBucket)
            .where(WebhookRateBucket.flow_id == fid)
            .values(tokens=0.0, refilled_at=time.time() + 3600)
        )
        assert drained.rowcount == 1  # type: ignore[attr-defined]
    r = await c.post(f"/webhooks/{fid}", json={})
    assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
    assert (
        r.json()["errors"][0]["message"]
        == f"Flow {fid} receives at most 5000 webhooks per second; retry later."
    )
    assert await count_executions(db, fid) == 20


async def test_rate_limit_holds_across_api_processes(
    configured: MakeClient, admin: Account, db: Database, db_url: str
) -> None:
    engine_side = await configured()
    fid = await active_flow(engine_side, admin, flow_body())
    # Two API "processes": separate apps with separate connection pools on one database.
    limits = {"webhook_rate_limit": 0.01, "webhook_rate_burst": 5, "webhook_group_commit_ms": 20}
    other_db = Database(db_url)
    try:
        a = await configured(run_engine=False, **limits)
        b = await configured(run_engine=False, database=other_db, **limits)
        replies = await asyncio.gather(*(cl.post(f"/webhooks/{fid}", json={}) for cl in [a, b] * 8))
    finally:
        await other_db.dispose()
    codes = sorted(r.status_code for r in replies)
    assert codes == [202] * 5 + [429] * 11, [r.text for r in replies]
    assert await count_executions(db, fid) == 5
    retry = {int(r.headers["Retry-After"]) for r in replies if r.status_code == 429}
    assert all(90 <= s <= 100 for s in retry), retry  # one token per 100 s


async def test_idle_rate_buckets_are_pruned(configured: MakeClient, admin: Account, db: Database) -> None:
    c = await configured(webhook_rate_limit=1.0)
    fid = await active_flow(c, admin, flow_body())
    assert (await c.post(f"/webhooks/{fid}", json={})).status_code == 202

    async def buckets() -> int:
        async with db.read() as session:
            return int(await session.scalar(sa.select(sa.func.count()).select_from(WebhookRateBucket)) or 0)

    assert await buckets() == 1
    hour = await pruner.prune(db, retention=timedelta(days=14), batch=100, now=utcnow() + timedelta(hours=1))
    assert hour["webhook_rate_buckets"] == 0 and await buckets() == 1
    later = await pruner.prune(db, retention=timedelta(days=14), batch=100, now=utcnow() + timedelta(days=2))
    assert later["webhook_rate_buckets"] == 1 and await buckets() == 0


async def test_respond_headers_cannot_break_the_reply(configured: MakeClient, admin: Account) -> None:
    c = await configured()
    framing = {"Content-Length": "999", "Transfer-Encoding": "chunked", "Bad Name": "x"}
    headers = {"X-Ok": "1", "X-Not-Latin-1": "\u20ac", "Content-Type": "application/vnd.example+json"}

    def body(h: dict[str, str]) -> dict[str, object]:
        return flow_body(
            graph={
                "nodes": [
                    {"id": "in"},
                    {"id": "r", "componentId": "respond", "fields": {"status": 201, "headers": h}},
                ],
                "edges": [{"source": "in", "target": "r"}],
            }
        )

    # The service frames the reply: framing headers and invalid names are refused when saved.
    r = await c.post("/flows", json=body({**headers, **framing}), headers=admin.headers)
    assert r.status_code == 400 and all(name in r.text for name in framing), r.text
    fid = await active_flow(c, admin, body(headers))
    r = await c.post(f"/webhooks/{fid}", params={"wait": 10}, json={"a": 1})
    assert r.status_code == 201 and r.json() == {"a": 1}
    assert r.headers["X-Ok"] == "1", r.headers
    assert r.headers.get_list("content-type") == ["application/vnd.example+json"], r.headers
    assert r.headers.get_list("content-length") == [str(len(r.content))]
    assert "transfer-encoding" not in r.headers and "x-not-latin-1" not in r.headers
