"""Ugly input on both databases: every request gets the error shape and a 4xx
(never a 500), and the stored flows are unchanged afterwards."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from tests.api.test_flows import assert_error, cheap_password_hashing  # noqa: F401
from tests.conftest import Account, flow_body

MiB = 1024 * 1024


@pytest.fixture
async def stored(client: httpx.AsyncClient, admin: Account) -> dict[str, Any]:
    r = await client.post("/flows", json=flow_body("stored"), headers=admin.headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]


async def snapshot(client: httpx.AsyncClient, admin: Account) -> Any:
    r = await client.get("/flows?page[size]=1000", headers=admin.headers)
    assert r.status_code == 200, r.text
    return r.json()


def json_headers(admin: Account, content_type: str | None = "application/json") -> dict[str, str]:
    headers = dict(admin.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


async def send_both(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], content: bytes, **kw: Any
) -> list[httpx.Response]:
    """The same raw body as a create and as an update of the stored flow."""
    headers = kw.pop("headers", json_headers(admin))
    return [
        await client.post("/flows", content=content, headers=headers),
        await client.patch(f"/flows/{stored['id']}", content=content, headers=headers),
    ]


def _set(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(body)
    target: Any = body
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return body


WRONG_TYPES = [
    ("name", 123),
    ("name", ["a"]),
    ("name", {"a": 1}),
    ("name", True),
    ("description", []),
    ("description", 1.5),
    ("tenant", 5),
    ("type", 1),
    ("type", ["ordinary"]),
    ("cron", 5),
    ("cron", {"min": 1}),
    ("owners", {"id": "x"}),
    ("owners", [{"id": 1, "type": "user"}]),
    ("owners", [[]]),
    ("owners", "me"),
    ("graph", []),
    ("graph", "nodes"),
    ("graph.nodes", {"id": "a"}),
    ("graph.nodes", [1, 2]),
    ("graph.nodes", [[1]]),
    ("graph.nodes.0", None),
    ("graph.nodes.0.id", 5),
    ("graph.nodes.0.id", None),
    ("graph.nodes.0.componentId", 7),
    ("graph.nodes.0.function", []),
    ("graph.nodes.1.fields", "info"),
    ("graph.nodes.1.fields", [1]),
    ("graph.nodes.1.fields", {"level": 3}),
    ("graph.nodes.0.name", {}),
    ("graph.nodes.0.credentials_id", 1),
    ("graph.edges", {"source": "in"}),
    ("graph.edges", "in->out"),
    ("graph.edges.0", []),
    ("graph.edges.0.source", 1),
    ("graph.edges.0.target", None),
    ("graph.edges.0.config", []),
    ("graph.edges.0.config", {"condition": 5}),
    ("graph.edges.0.config", {"condition": ""}),
    ("graph.edges.0.config", {"mapper": []}),
    ("graph.edges.0.config", {"mapper": 3}),
    ("status", 1),
    ("webhookSecret", 12345678901234567890),
]


@pytest.mark.parametrize(("path", "value"), WRONG_TYPES, ids=[f"{p}={v!r}" for p, v in WRONG_TYPES])
async def test_wrong_json_types(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], path: str, value: Any
) -> None:
    before = await snapshot(client, admin)
    body = _set(flow_body(), path, value)
    for r in await send_both(client, admin, stored, orjson.dumps(body)):
        errors = assert_error(r, 400)
        assert any(e.get("field", "").startswith(path.split(".")[0]) for e in errors), errors
    # A PATCH carrying only the wrong field, too.
    top = path.split(".")[0]
    r = await client.patch(f"/flows/{stored['id']}", json={top: body[top]}, headers=admin.headers)
    assert_error(r, 400)
    assert await snapshot(client, admin) == before


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"null",
        b"0",
        b"-1.5e300",
        b'"a string"',
        b"true",
        b"{",
        b'{"name": }',
        b"[1, 2",
        b"\xff\xfe\xfa",
        b'{"name": "\xc3\x28"}',
        b'{"name": "\\ud800"}',
        b"{'name': 'single quotes'}",
        b'{"name": NaN}',
        b'{"name": 1e400}',
        b"\x00",
        b'{"name": "x"} trailing',
        b"\xef\xbb\xbf{}",
    ],
)
async def test_malformed_bodies(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], raw: bytes
) -> None:
    before = await snapshot(client, admin)
    for r in await send_both(client, admin, stored, raw):
        assert_error(r, 400)
    assert await snapshot(client, admin) == before


async def test_empty_object_creates_nothing(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post("/flows", content=b"{}", headers=json_headers(admin))
    assert {e["field"] for e in assert_error(r, 400)} == {"name", "type", "graph"}


async def test_array_of_junk_gives_per_item_errors(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post("/flows", json=[None, 1, "x", [], {}], headers=admin.headers)
    assert r.status_code == 201, r.text
    for item in r.json()["data"]:
        assert item["errors"][0]["code"] == 400
    assert (await client.get("/flows", headers=admin.headers)).json()["meta"]["total"] == 0


async def test_array_too_many_items(client: httpx.AsyncClient, admin: Account) -> None:
    assert_error(await client.post("/flows", json=[{}] * 1001, headers=admin.headers), 400)


async def test_deep_nesting(client: httpx.AsyncClient, admin: Account, stored: dict[str, Any]) -> None:
    before = await snapshot(client, admin)
    deep = b"[" * 10_000 + b"]" * 10_000
    for r in await send_both(client, admin, stored, deep):
        assert_error(r, 400)
    nested = b'{"name": "deep", "type": "ordinary", "graph": ' + b'{"a":' * 10_000 + b"1" + b"}" * 10_001
    for r in await send_both(client, admin, stored, nested):
        assert_error(r, 400)
    # Deep but parseable: in a node's free-form fields.
    fields: Any = 1
    for _ in range(200):
        fields = {"a": fields}
    body = flow_body(graph={"nodes": [{"id": "a", "fields": fields}], "edges": []})
    for r in await send_both(client, admin, stored, orjson.dumps(body)):
        assert_error(r, 400)
    assert await snapshot(client, admin) == before


async def test_huge_strings(client: httpx.AsyncClient, admin: Account, stored: dict[str, Any]) -> None:
    before = await snapshot(client, admin)
    for key in ("name", "description", "tenant", "cron"):
        body = flow_body(**{key: "x" * (MiB // 2)})
        for r in await send_both(client, admin, stored, orjson.dumps(body)):
            assert key in {e.get("field") for e in assert_error(r, 400)}
    body = flow_body(graph={"nodes": [{"id": "a", "componentId": "log", "fields": {"level": "x" * 900_000}}]})
    for r in await send_both(client, admin, stored, orjson.dumps(body)):
        assert_error(r, 400)
    # Over the body limit: 413 before anything is parsed.
    body = flow_body(description="x" * (MiB + 10))
    for r in await send_both(client, admin, stored, orjson.dumps(body)):
        assert_error(r, 413)
    assert await snapshot(client, admin) == before


async def test_body_limit_without_content_length(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any]
) -> None:
    before = await snapshot(client, admin)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(40):
            yield b"x" * 64 * 1024
        yield b'"}'

    for method, url in (("POST", "/flows"), ("PATCH", f"/flows/{stored['id']}")):
        r = await client.request(method, url, content=chunks(), headers=json_headers(admin))
        assert "content-length" not in r.request.headers
        assert_error(r, 413)
    r = await client.post(
        "/flows", content=b"x" * (MiB + 1), headers={**json_headers(admin), "Content-Length": str(MiB + 1)}
    )
    assert_error(r, 413)
    assert await snapshot(client, admin) == before


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "json", ""],
)
async def test_wrong_content_type(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], content_type: str | None
) -> None:
    before = await snapshot(client, admin)
    headers = json_headers(admin, content_type)
    for r in await send_both(client, admin, stored, orjson.dumps(flow_body("sneaky")), headers=headers):
        assert_error(r, 415)
    assert await snapshot(client, admin) == before


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "APPLICATION/JSON", "application/merge-patch+json"]
)
async def test_json_content_type_variants_accepted(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], content_type: str
) -> None:
    headers = json_headers(admin, content_type)
    r = await client.patch(f"/flows/{stored['id']}", content=orjson.dumps({"name": "fine"}), headers=headers)
    assert r.status_code == 200, r.text


NUL_BODIES = [
    ("name", "a\x00b"),
    ("description", "\x00"),
    ("tenant", "t\x00"),
    ("cron", "* * * * *\x00"),
    ("owners", [{"id": "u\x00", "type": "user"}]),
    ("graph.nodes.0.id", "in\x00"),
    ("graph.nodes.0.name", "node \x00"),
    ("graph.nodes.0.credentials_id", "c\x00"),
    ("graph.nodes.1.fields", {"level": "info", "message": "hi\x00there"}),
    ("graph.nodes.1.fields", {"level": "info", "message\x00": "key with NUL"}),
    ("graph.edges.0.id", "e\x00"),
    ("graph.edges.0.config", {"condition": "a = '\x00'"}),
    ("graph.edges.0.config", {"mapper": {"k\x00": "a"}}),
    ("webhookSecret", "s" * 16 + "\x00"),
]


@pytest.mark.parametrize(("path", "value"), NUL_BODIES, ids=[p for p, _ in NUL_BODIES])
async def test_nul_characters(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], path: str, value: Any
) -> None:
    """PostgreSQL cannot store U+0000 in text; it must be a 400 on both databases, not a 500."""
    before = await snapshot(client, admin)
    body = _set(flow_body(), path, value)
    for r in await send_both(client, admin, stored, orjson.dumps(body)):
        assert_error(r, 400)
    assert await snapshot(client, admin) == before


@pytest.mark.parametrize(
    "query",
    [
        {"search": "a\x00b"},
        {"filter[user]": "u\x00"},
        {"filter[status]": "active\x00"},
        {"sort": "name\x00"},
        {"page[size]": "1\x00"},
        {"filter[\x00]": "x"},
        {"page[number]": "9" * 40},
        {"page[number]": str(2**63)},
        {"page[size]": str(-(2**63))},
        {"page[number]": "\u0661"},  # an Arabic-Indic digit: int() would take it
        {"page[size]": "\uff15"},  # fullwidth digit
        {"page[number]": " 2"},
        {"page[number]": "0x10"},
        {"page[number]": "1_000"},
    ],
)
async def test_bad_list_queries(client: httpx.AsyncClient, admin: Account, query: dict[str, str]) -> None:
    assert_error(await client.get("/flows", params=query, headers=admin.headers), 400)


async def test_odd_but_harmless_list_queries(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any]
) -> None:
    for query in ({"search": "'; DROP TABLE flows; --"}, {"search": "😀"}, {"filter[user]": "😀" * 10}):
        r = await client.get("/flows", params=query, headers=admin.headers)
        assert r.status_code == 200, r.text
        assert r.json()["meta"]["total"] == 0
    r = await client.get("/flows", params={"search": "STORED"}, headers=admin.headers)
    assert r.json()["meta"]["total"] == 1


@pytest.mark.parametrize(
    "flow_id",
    [
        "".join(chr(ord(c) + 0xFEE0) for c in "0123456789abcdef01234567"),  # fullwidth hex digits
        "".join(chr(0x660 + int(c)) for c in "0123456789") + "abcdef01234567",  # Arabic-Indic digits
        "0123456789abcdef0123456\u00e9",
        "0123456789abcdef0123456%00",
        "0123456789abcdef01234567%0A",
        "0123456789abcdef01234567%0D%0A",
        "😀" * 24,
        "%00",
        "%ff%fe",
        "..%2f..%2fetc",
        "0123456789abcdef01234567 ",
        "x" * 10_000,
    ],
)
async def test_unicode_and_odd_ids(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any], flow_id: str
) -> None:
    before = await snapshot(client, admin)
    url = f"/flows/{flow_id}"
    for r in (
        await client.get(url, headers=admin.headers),
        await client.delete(url, headers=admin.headers),
        await client.patch(url, json={"name": "x"}, headers=admin.headers),
        await client.post(f"{url}/start", headers=admin.headers),
        await client.post(f"{url}/stop", headers=admin.headers),
    ):
        # "%2f" decodes to "/", so that one reaches no route at all (404).
        assert_error(r, 404 if "%2f" in flow_id else 400)
    assert await snapshot(client, admin) == before


async def test_bad_tokens(client: httpx.AsyncClient, stored: dict[str, Any]) -> None:
    for value in ("Bearer", "Bearer ", "Basic abc", "Bearer \x7f", "Bearer " + "x" * 10_000, "bearer nope"):
        r = await client.get("/flows", headers={"Authorization": value})
        assert_error(r, 401)
    r = await client.get("/flows", headers={b"Authorization": b"Bearer \xff\xfe"})
    assert_error(r, 401)


async def test_start_ignores_a_body(
    client: httpx.AsyncClient, admin: Account, stored: dict[str, Any]
) -> None:
    r = await client.post(f"/flows/{stored['id']}/start", content=b"\xff garbage", headers=admin.headers)
    assert r.status_code == 200, r.text
