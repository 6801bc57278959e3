"""The OpenAPI document names the parameters clients actually send."""

from __future__ import annotations

import httpx


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
