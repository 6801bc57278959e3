"""``POST /webhooks/{flowId}`` has one server (the ASGI fast path), one parser
(``handler.parse``) and an explicit OpenAPI description that states what that
parser enforces."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from flowyard.errors import InvalidInput, UnsupportedMediaType
from flowyard.ids import new_id
from flowyard.webhooks import handler

JSON = {"Content-Type": "application/json"}


def _operation(doc: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = doc["paths"]["/webhooks/{flowId}"]["post"]
    return op


def _param(op: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in op["parameters"] if p["name"] == name)
    return found


async def test_the_endpoint_is_documented(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    op = _operation(doc)
    assert [(p["name"], p["in"]) for p in op["parameters"]] == [
        ("flowId", "path"),
        ("wait", "query"),
        ("Idempotency-Key", "header"),
        ("X-Flowyard-Signature", "header"),
    ]
    assert op["requestBody"]["required"] is True and list(op["requestBody"]["content"]) == [
        "application/json"
    ]
    assert {"200", "202", "400", "401", "404", "409", "413", "415", "429", "502", "503"} == set(
        op["responses"]
    )
    accepted = op["responses"]["202"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    single = doc["components"]["schemas"][accepted]
    inner = single["properties"]["data"]["$ref"].rsplit("/", 1)[1]
    assert doc["components"]["schemas"][inner]["required"] == ["executionId", "flowId", "status"]
    for code, response in op["responses"].items():
        if code.startswith(("4", "5")):
            assert response["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorResponse"
            }, code
    assert "Retry-After" in op["responses"]["429"]["headers"]


def test_no_route_serves_webhooks(app: FastAPI) -> None:
    """The fast path is the only server: no FastAPI route that could answer differently."""
    paths = {getattr(ctx, "path", "") for ctx in iter_route_contexts(app.routes)}
    assert not any(p.startswith("/webhooks") for p in paths), paths


async def test_documented_limits_are_the_enforced_ones(client: httpx.AsyncClient) -> None:
    """Each documented bound, just inside (the request gets past parsing: 404, the flow does not
    exist) and just outside (400 naming the field), read from the document itself."""
    op = _operation((await client.get("/openapi.json")).json())
    url = f"/webhooks/{new_id()}"
    wait = _param(op, "wait")["schema"]
    key = _param(op, "Idempotency-Key")["schema"]
    inside = [
        ({"wait": str(wait["maximum"])}, {}),
        ({"wait": "0.001"}, {}),
        ({}, {"Idempotency-Key": "k" * key["maxLength"]}),
        ({}, {"Idempotency-Key": "k" * key["minLength"]}),
    ]
    for params, headers in inside:
        r = await client.post(url, params=params, content=b"{}", headers={**JSON, **headers})
        assert r.status_code == 404, (params, headers, r.text)
    outside = [
        ({"wait": str(wait["maximum"] + 0.5)}, {}, "wait"),
        ({"wait": str(wait["exclusiveMinimum"])}, {}, "wait"),
        ({"wait": "nan"}, {}, "wait"),
        ({}, {"Idempotency-Key": "k" * (key["maxLength"] + 1)}, "Idempotency-Key"),
        ({}, {"Idempotency-Key": ""}, "Idempotency-Key"),
    ]
    for params, headers, field in outside:
        r = await client.post(url, params=params, content=b"{}", headers={**JSON, **headers})
        assert r.status_code == 400, (params, headers, r.text)
        assert [e.get("field") for e in r.json()["errors"]] == [field]
    assert (await client.post(url, content=b"{}", headers={"Content-Type": "text/plain"})).status_code == 415
    assert (await client.post(url, content=b"", headers=JSON)).status_code == 400


def test_parse_reads_and_validates_the_request() -> None:
    headers = [
        (b"content-type", b"application/vnd.acme+json; charset=utf-8"),
        (b"idempotency-key", b"key-1"),
        (b"x-flowyard-signature", b"t=1,v1=00"),
        (b"x-other", b"ignored"),
    ]
    call = handler.parse("f1", headers, b"a=1&wait=2.5", b'{"a": [1, "\xc3\xa9"]}')
    assert call == handler.WebhookCall(
        flow_id="f1",
        payload={"a": [1, "é"]},
        raw=b'{"a": [1, "\xc3\xa9"]}',
        wait=2.5,
        idempotency_key="key-1",
        signature="t=1,v1=00",
    )
    plain = handler.parse("f1", [(b"content-type", b"application/json")], b"", b"1")
    assert (plain.wait, plain.idempotency_key, plain.signature, plain.payload) == (None, None, None, 1)
    with pytest.raises(UnsupportedMediaType):
        handler.parse("f1", [], b"", b"{}")
    # Refusals name a position, never the parser's own text (the caller is anonymous).
    with pytest.raises(InvalidInput) as bad:
        handler.parse("f1", [(b"content-type", b"application/json")], b"", b'{"a": tru}')
    assert bad.value.message == "The body is not valid JSON (line 1, column 7)."
    for query in (b"wait=0", b"wait=-1", b"wait=inf", b"wait=61", b"wait=x"):
        with pytest.raises(InvalidInput) as refused:
            handler.parse("f1", [(b"content-type", b"application/json")], query, b"{}")
        assert [p.field for p in refused.value.problems] == ["wait"], query


async def test_webhooks_skip_the_framework_layers_but_not_ours(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    """A webhook is answered before FastAPI's own layers (app.py ``_FlowyardAPI``), through the
    same request-id, body-limit and request-rule chain as every other request; everything else
    still takes the whole stack. Proved by breaking the framework's stack."""
    assert (await client.get("/health")).status_code == 200  # builds the stack

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the framework's stack served a webhook")

    whole = app.middleware_stack
    app.middleware_stack = broken
    try:
        url = f"/webhooks/{new_id()}"
        r = await client.post(url, content=b"{}", headers={**JSON, "X-Request-ID": "front-1"})
        assert r.status_code == 404 and r.headers["x-request-id"] == "front-1", r.text
        assert r.json()["errors"][0]["message"].startswith("Flow ")
        big = b'{"a": "' + b"x" * (app.state.settings.max_body_bytes + 1) + b'"}'
        assert (await client.post(url, content=big, headers=JSON)).status_code == 413
        nul = await client.post(url, params={"wait": "1\x00"}, content=b"{}", headers=JSON)
        assert nul.status_code == 400 and "NUL" in nul.json()["errors"][0]["message"]
        with pytest.raises(AssertionError, match="framework's stack"):
            await client.post("/webhooks/a/b", content=b"{}", headers=JSON)  # not a webhook: the app's
    finally:
        app.middleware_stack = whole
    assert (await client.post("/webhooks/a/b", content=b"{}", headers=JSON)).status_code == 404


async def test_webhooks_take_the_whole_stack_when_telemetry_is_on(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    """With an OpenTelemetry provider configured (FastAPI's native telemetry on), webhooks go
    through the framework's stack and keep their spans; the answer is the same."""
    assert getattr(app, "_front", None) is None
    app._native_telemetry.enabled = lambda: True  # type: ignore[attr-defined]
    url = f"/webhooks/{new_id()}"
    r = await client.post(url, content=b"{}", headers={**JSON, "X-Request-ID": "stack-1"})
    assert r.status_code == 404 and r.headers["x-request-id"] == "stack-1", r.text
    assert app._front is False  # type: ignore[attr-defined]


async def test_a_failure_before_the_answer_is_a_500_in_the_contract_shape(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    """Whatever escapes the webhook chain before it answers: a 500 in the error shape, no
    exception text (the caller is anonymous)."""

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("secret internal detail")

    app.webhook_chain = failing  # type: ignore[attr-defined]
    r = await client.post(f"/webhooks/{new_id()}", content=b"{}", headers=JSON)
    assert r.status_code == 500
    assert r.json()["errors"][0]["code"] == 500 and "secret" not in r.text
