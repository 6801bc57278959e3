"""Durable joins and sub-flows (SPEC §12, §11) with a real `flowyard serve`: executions parked
with a join holding part of its set, and parents parked on a child that is itself parked,
survive SIGKILL of every flowyard process and finish after a restart with the right results.
Small on purpose (a few executions): the scale of parking is tests/engine/test_failure_durability.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import sqlalchemy as sa

from flowyard.queue.models import Execution
from tests.engine.test_failure_durability import _Serve, _statuses, _until
from tests.engine.test_processes import ADMIN, _empty, _free_port, _query

pytestmark = [pytest.mark.slow]
DELAY = 8  # seconds: still parked when the processes are killed, on a loaded machine too
N = 2  # executions of each flow


@pytest.fixture(params=["sqlite", "postgres"])
def serve_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        asyncio.run(_empty(url))
        return url
    return f"sqlite+aiosqlite:///{(tmp_path / 'flowyard.db').resolve()}"


def _flow(s: _Serve, headers: dict[str, str], name: str, graph: dict[str, Any], *, start: bool = True) -> str:
    r = httpx.post(
        f"{s.base}/flows", json={"name": name, "type": "ordinary", "graph": graph}, headers=headers
    )
    assert r.status_code == 201, r.text
    fid = str(r.json()["data"]["id"])
    if not start:
        return fid
    assert httpx.post(f"{s.base}/flows/{fid}/start", headers=headers).status_code == 200
    _until(
        lambda: httpx.get(f"{s.base}/flows/{fid}", headers=headers).json()["data"]["status"] == "active",
        30,
        "flow active",
    )
    return fid


def _edges(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"source": a, "target": b} for a, b in pairs]


def test_joins_and_sub_flows_survive_sigkill_of_every_process(serve_url: str, tmp_path: Path) -> None:
    url = serve_url
    port = _free_port()
    s = _Serve(url, tmp_path, port, 1)
    delay = {"id": "d", "componentId": "delay", "fields": {"seconds": DELAY}}
    try:
        s.wait_ready()
        token = httpx.post(f"{s.base}/login", json={"username": ADMIN[0], "password": ADMIN[1]}).json()[
            "token"
        ]
        headers = {"Authorization": f"Bearer {token}"}
        # in -> j is the join's first edge and arrives first; the second comes after the delay.
        join_flow = _flow(
            s,
            headers,
            "join",
            {
                "nodes": [
                    {"id": "in"},
                    {"id": "j", "componentId": "join", "fields": {"timeout": 600}},
                    delay,
                    {"id": "b", "componentId": "jsonata", "fields": {"expression": "'b' & k"}},
                ],
                "edges": _edges(("in", "j"), ("in", "d"), ("d", "b"), ("b", "j")),
            },
        )
        child = _flow(
            s,
            headers,
            "child",
            {
                "nodes": [
                    {"id": "in"},
                    delay,
                    {"id": "x", "componentId": "jsonata", "fields": {"expression": "'child ' & k"}},
                ],
                "edges": _edges(("in", "d"), ("d", "x")),
            },
            start=False,
        )
        parent = _flow(
            s,
            headers,
            "parent",
            {
                "nodes": [{"id": "in"}, {"id": "call", "componentId": "flow", "fields": {"flowId": child}}],
                "edges": _edges(("in", "call")),
            },
        )
        sent: dict[str, tuple[str, str]] = {}  # execution id: flow, key
        for i in range(N):
            for fid in (join_flow, parent):
                r = httpx.post(f"{s.base}/webhooks/{fid}", json={"k": f"k{i}"}, timeout=30)
                assert r.status_code == 202, r.text
                sent[r.json()["data"]["executionId"]] = (fid, f"k{i}")

        def children() -> list[str]:
            rows = _query(url, sa.select(Execution.id).where(Execution.flow_id == child))
            return [r.id for r in rows]

        _until(
            lambda: (
                len(children()) == N and set(_statuses(url, [*sent, *children()]).values()) == {"waiting"}
            ),
            60,
            f"all parked: {_statuses(url, list(sent))}",
        )
        s.kill_all()
    except BaseException:
        s.stop()
        raise
    ids = [*sent, *children()]
    assert set(_statuses(url, ids).values()) == {"waiting"}
    held = _query(url, sa.select(sa.cast(Execution.state, sa.Text)).where(Execution.flow_id == join_flow))
    assert all(json.loads(r[0])["joins"]["j"]["arrivals"] for r in held)  # the held half is stored

    s2 = _Serve(url, tmp_path, port, 2)
    try:
        s2.wait_ready()
        _until(
            lambda: set(_statuses(url, ids).values()) <= {"succeeded", "failed", "cancelled"},
            90,
            "all resumed and finished",
        )
    finally:
        s2.stop()
    assert set(_statuses(url, ids).values()) == {"succeeded"}, s2.log()
    rows = _query(
        url, sa.select(Execution.id, sa.cast(Execution.result, sa.Text)).where(Execution.id.in_(list(sent)))
    )
    results = {r.id: orjson.loads(r[1]) for r in rows}
    for eid, (fid, key) in sent.items():
        want = [{"k": key}, f"b{key}"] if fid == join_flow else f"child {key}"
        assert results[eid] == {"data": want}, (eid, results[eid])
