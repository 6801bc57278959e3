"""The OpenAPI document names the parameters clients actually send."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from flowyard.ids import ID_PATTERN, new_id
from tests.api.test_flows import cheap_password_hashing  # noqa: F401
from tests.conftest import Account, Factory


async def test_documented_parameter_names_are_the_real_ones(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    names = {
        (path, method): [p["name"] for p in op.get("parameters", [])]
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    }
    assert all(not n.startswith("_") for params in names.values() for n in params), names
    assert names[("/flows", "get")] == [
        "page[size]",
        "page[number]",
        "filter[status]",
        "filter[type]",
        "filter[user]",
        "sort",
        "search",
    ]
    assert {"page[size]", "page[number]", "filter[status]", "filter[user]", "sort", "search", "tags"} <= set(
        names[("/templates", "get")]
    )
    assert "filter[tenant]" in names[("/logs", "get")]
    assert "/webhooks/{flowId}" in doc["paths"] and "ErrorResponse" in doc["components"]["schemas"]


async def _doc(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


async def test_every_id_parameter_has_the_id_pattern(client: httpx.AsyncClient) -> None:
    doc = await _doc(client)
    seen = 0
    for path, ops in doc["paths"].items():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"] == "id":
                    assert param["schema"]["pattern"] == ID_PATTERN, (path, param)
                    seen += 1
    assert seen >= 20
    assert re.fullmatch(ID_PATTERN.strip("^$"), new_id())


async def test_every_operation_documents_its_errors(client: httpx.AsyncClient) -> None:
    doc = await _doc(client)
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            expected = {"400"} | ({"413", "415"} if "requestBody" in op else set())
            assert expected <= set(responses), (method, path, sorted(responses))
            for code, response in responses.items():
                if code.startswith("4") or (code.startswith("5") and path != "/health/ready"):
                    assert response["content"]["application/json"]["schema"] == error_ref, (
                        method,
                        path,
                        code,
                    )
    assert "409" in doc["paths"]["/roles/{id}"]["patch"]["responses"]


async def test_patch_bodies_have_partial_schemas(client: httpx.AsyncClient) -> None:
    doc = await _doc(client)
    schemas = doc["components"]["schemas"]
    for path, name in (("/flows/{id}", "MutableFlowPatch"), ("/templates/{id}", "MutableFlowTemplatePatch")):
        body = doc["paths"][path]["patch"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        patch = schemas[name]
        assert not patch.get("required"), patch
        # A field required on create may be omitted but not null; an optional one may be null.
        assert (
            patch["properties"]["name"].get("type") == "string"
            and "default" not in patch["properties"]["name"]
        )
        assert {"type": "null"} in patch["properties"]["description"]["anyOf"]
    assert set(schemas["MutableFlow"]["required"]) == {"name", "graph", "type"}
    user = schemas["UserUpdate"]["properties"]
    for name in ("firstname", "lastname", "password", "permissions", "roles", "status", "confirmed"):
        assert "anyOf" not in user[name] and "default" not in user[name], (name, user[name])
    assert {"type": "null"} in user["tenant"]["anyOf"]
    for name in ("FlowGraph", "Node", "Edge", "Owner", "EdgeConfig"):
        assert schemas[name]["additionalProperties"] is False, name
    assert schemas["FlowGraph"]["properties"]["nodes"]["minItems"] == 1


async def test_null_where_the_document_says_not_null_is_refused(
    client: httpx.AsyncClient, admin: Account, factory: Factory
) -> None:
    user = await factory.user()
    headers = {**admin.headers, "Content-Type": "application/json"}
    for name in ("firstname", "lastname", "password", "permissions", "roles", "status", "confirmed"):
        r = await client.patch(f"/api/users/{user.id}", content=orjson.dumps({name: None}), headers=headers)
        assert r.status_code == 400, (name, r.text)
    r = await client.patch(f"/api/users/{user.id}", content=orjson.dumps({"img": None}), headers=headers)
    assert r.status_code == 200, r.text


def _param(doc: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    params = doc["paths"][path]["get"]["parameters"]
    return dict(next(p for p in params if p["name"] == name)["schema"])


async def test_documented_query_values_are_the_accepted_ones(
    client: httpx.AsyncClient, admin: Account
) -> None:
    """Each documented value is answered 200; a value just outside is 400."""
    doc = await _doc(client)
    cases = [
        ("/flows", "filter[status]"),
        ("/flows", "filter[type]"),
        ("/flows", "sort"),
        ("/templates", "filter[status]"),
        ("/templates", "sort"),
        ("/executions", "filter[status]"),
        ("/icenter/executions", "groupby"),
    ]
    for path, name in cases:
        values = _param(doc, path, name)["enum"]
        assert values, (path, name)
        for value in values:
            r = await client.get(path, params={name: value}, headers=admin.headers)
            assert r.status_code == 200, (path, name, value, r.text)
        for wrong in ("", "x", values[0].upper() + "x"):
            r = await client.get(path, params={name: wrong}, headers=admin.headers)
            assert r.status_code == 400, (path, name, wrong, r.text)
    for path, name, good, bad in (
        ("/executions", "filter[flowId]", new_id(), "abc"),
        ("/icenter/executions", "start", "2026-01-02", "2026-W01-1"),
        ("/logs", "filter[flowId]", new_id(), "abc"),
        ("/logs", "showErrors", "TRUE", "maybe"),
        ("/logs", "from", "2026-01-02T03:04:05Z", "yesterday"),
    ):
        pattern = _param(doc, path, name)["pattern"]
        assert re.search(pattern, good) and not re.search(pattern, bad), (name, pattern)
        extra = {"filter[tenant]": admin.id} if path == "/logs" else {}
        assert (
            await client.get(path, params={name: good, **extra}, headers=admin.headers)
        ).status_code == 200
        assert (await client.get(path, params={name: bad, **extra}, headers=admin.headers)).status_code == 400
    assert _param(doc, "/logs", "filter[tenant]")["minLength"] == 1
