"""/metrics and JSON logs of real processes after a scripted workload: a two-process
`flowyard serve` (SQLite), and on PostgreSQL `serve --no-engine` beside a separate
`flowyard worker` with its own metrics listener. The counters match what the database
says happened; every log line is JSON and carries its request id; no secret the
workload used appears anywhere in the output."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from flowyard.queue.models import Execution
from flowyard.webhooks.signature import signature_header
from tests.engine.test_processes import ADMIN, Cluster, _empty, _query
from tests.engine.test_serve_processes import Serve

pytestmark = [pytest.mark.slow]
FINAL = ("succeeded", "failed", "cancelled")
HOOK_SECRET = "whsec-observability-7f3a9c"
SECRET_VALUE = "s3cr3t-credential-value-91b2"
METRICS_TOKEN = "metrics-token-4d8e1f0a"
TRACE_ID = "trace-abc-123"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def _wait_active(base: str, headers: dict[str, str], fid: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{base}/flows/{fid}", headers=headers).json()["data"]["status"] == "active":
            return
        time.sleep(0.1)
    raise AssertionError("flow did not become active")


def _workload(base: str) -> dict[str, Any]:
    """Login, a token, a secret, a signed flow (webhooks that succeed, fail, are refused),
    and a cron flow that ticks a few times and is stopped."""
    r = httpx.post(f"{base}/login", json={"username": ADMIN[0], "password": ADMIN[1]})
    assert r.status_code == 200, r.text
    login_token = r.json()["token"]
    headers = {"Authorization": f"Bearer {login_token}"}
    r = httpx.post(f"{base}/tokens", json={"description": "ci"}, headers=headers)
    assert r.status_code == 201, r.text
    api_token = r.json()["data"]["token"]
    headers = {"Authorization": f"Bearer {api_token}"}
    r = httpx.post(
        f"{base}/secrets", json={"name": "creds", "value": {"token": SECRET_VALUE}}, headers=headers
    )
    assert r.status_code == 201, r.text
    flow = {
        "name": "pick",
        "type": "ordinary",
        "webhookSecret": HOOK_SECRET,
        "graph": {
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "pick", "componentId": "jsonata", "fields": {"expression": "value"}},
            ],
            "edges": [{"source": "in", "target": "pick"}],
        },
    }
    r = httpx.post(f"{base}/flows", json=flow, headers=headers)
    assert r.status_code == 201, r.text
    fid = r.json()["data"]["id"]
    assert httpx.post(f"{base}/flows/{fid}/start", headers=headers).status_code == 200
    _wait_active(base, headers, fid)
    cron = {
        "name": "tick",
        "type": "ordinary",
        "cron": "* * * * * *",
        "graph": {"nodes": [{"id": "t", "componentId": "schedule"}], "edges": []},
    }
    r = httpx.post(f"{base}/flows", json=cron, headers=headers)
    assert r.status_code == 201, r.text
    cron_id = r.json()["data"]["id"]
    assert httpx.post(f"{base}/flows/{cron_id}/start", headers=headers).status_code == 200

    signatures: list[str] = []
    ok = bad = 0
    with httpx.Client(base_url=base) as c:
        for i in range(12):
            raw = json.dumps({"value": i} if i % 3 else {"other": i}).encode()
            sig = signature_header(HOOK_SECRET, raw, int(time.time()))
            signatures.append(sig.split("v1=", 1)[1])
            r = c.post(
                f"/webhooks/{fid}",
                content=raw,
                headers={
                    "Content-Type": "application/json",
                    "X-Flowyard-Signature": sig,
                    "X-Request-ID": f"{TRACE_ID}-{i}",
                },
            )
            assert r.status_code == 202, r.text
            assert r.headers["x-request-id"] == f"{TRACE_ID}-{i}"
            ok, bad = (ok + 1, bad) if i % 3 else (ok, bad + 1)
        # Refused: no signature (401) and twice an unknown flow (404).
        assert c.post(f"/webhooks/{fid}", json={"value": 1}).status_code == 401
        for _ in range(2):
            assert c.post("/webhooks/0123456789abcdef01234567", json={}).status_code == 404

    time.sleep(2.5)  # a few cron ticks
    assert httpx.post(f"{base}/flows/{cron_id}/stop", headers=headers).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.get(f"{base}/flows/{cron_id}", headers=headers).json()["data"]["status"] == "inactive":
            break
        time.sleep(0.1)
    return {
        "fid": fid,
        "cron_id": cron_id,
        "ok": ok,
        "bad": bad,
        "secrets": [ADMIN[1], login_token, api_token, HOOK_SECRET, SECRET_VALUE, *signatures],
    }


def _settled(db_url: str) -> list[Any]:
    deadline = time.monotonic() + 60
    rows: list[Any] = []
    while time.monotonic() < deadline:
        rows = _query(db_url, sa.select(Execution.flow_id, Execution.trigger, Execution.status))
        if rows and all(r[2] in FINAL for r in rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"executions did not finish: {rows}")


def _check_counts(
    api: dict[Any, float], engine: dict[Any, float], work: dict[str, Any], rows: list[Any]
) -> None:
    assert value(api, "flowyard_webhooks_total", outcome="accepted") == work["ok"] + work["bad"]
    assert value(api, "flowyard_webhooks_total", outcome="signature") == 1
    assert value(api, "flowyard_webhooks_total", outcome="unknown_flow") == 2
    assert value(
        api, "flowyard_http_requests_total", method="POST", route="/webhooks/{flowId}", status="202"
    ) == (work["ok"] + work["bad"])
    cron_rows = [r for r in rows if r[0] == work["cron_id"]]
    assert cron_rows, "the cron flow ticked"
    hooks = [r for r in rows if r[0] == work["fid"]]
    assert sorted(r[2] for r in hooks) == sorted(["succeeded"] * work["ok"] + ["failed"] * work["bad"])
    finished = "flowyard_executions_finished_total"
    assert value(engine, finished, trigger="webhook", status="succeeded") == work["ok"]
    assert value(engine, finished, trigger="webhook", status="failed") == work["bad"]
    assert value(engine, finished, trigger="cron", status="succeeded") == len(cron_rows)
    assert value(engine, "flowyard_executions_started_total", trigger="webhook") == len(hooks)
    assert value(engine, "flowyard_executions_started_total", trigger="cron") == len(cron_rows)
    assert value(engine, "flowyard_cron_ticks_total", outcome="fired") == len(cron_rows)
    assert value(engine, "flowyard_execution_duration_seconds_count", trigger="webhook") == len(hooks)
    assert value(engine, "flowyard_lifecycle_moves_total", to="active") == 2
    assert value(engine, "flowyard_lifecycle_moves_total", to="inactive") == 1
    assert value(engine, "flowyard_runners_alive") == 1
    assert value(engine, "flowyard_db_commit_duration_seconds_count") > 0
    # Bounded labels: no id of any kind among the label values.
    for (_name, labels), _v in [*api.items(), *engine.items()]:
        for _k, v in labels:
            assert work["fid"] not in v and work["cron_id"] not in v


def _check_logs(text: str, secrets: list[str]) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for r in records:
        assert {"time", "level", "logger", "message"} <= r.keys(), r
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    assert access, "the access log went through the JSON formatter"
    assert all(r.get("requestId") for r in access), [r for r in access if not r.get("requestId")][:3]
    traced = [r for r in access if str(r.get("requestId", "")).startswith(TRACE_ID)]
    assert len(traced) == 12 and all("/webhooks/" in r["message"] for r in traced)
    for secret in secrets:
        assert secret not in text, f"a secret the workload used is in the logs: {secret[:6]}..."


def test_two_process_serve_metrics_and_json_logs(tmp_path: Path) -> None:
    s = Serve(
        None,
        tmp_path,
        env={
            "FLOWYARD_LOG_FORMAT": "json",
            "FLOWYARD_LOG_LEVEL": "info",
            "FLOWYARD_ACCESS_LOG": "true",
            "FLOWYARD_SCHEDULER_INTERVAL": "0.2",
            "FLOWYARD_POLL_INTERVAL": "0.2",
        },
    )
    try:
        s.wait_ready()
        work = _workload(s.base)
        rows = _settled(s.db_url)
        # Any API process answers with the sum over all processes: scrape several times
        # (the kernel spreads connections) and expect the same counts every time.
        found = samples(httpx.get(f"{s.base}/metrics").text)
        _check_counts(found, found, work, rows)
        for _ in range(4):
            again = samples(httpx.get(f"{s.base}/metrics").text)
            for key in ("accepted", "signature", "unknown_flow"):
                assert value(again, "flowyard_webhooks_total", outcome=key) == value(
                    found, "flowyard_webhooks_total", outcome=key
                )
        assert value(found, "flowyard_queue_executions", state="queued") == 0
    finally:
        code = s.stop()
    assert code == 0, s.log()
    _check_logs(s.log(), work["secrets"])


@pytest.fixture
def pg_cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    asyncio.run(_empty(postgres_url))
    c = Cluster(postgres_url, tmp_path)
    c.env.update(
        {
            "FLOWYARD_METRICS_TOKEN": METRICS_TOKEN,
            "FLOWYARD_LOG_FORMAT": "json",
            "FLOWYARD_LOG_LEVEL": "info",
            "FLOWYARD_ACCESS_LOG": "true",
            "FLOWYARD_LEASE_SECONDS": "30",
        }
    )
    c.start("api", "serve", "--no-engine")
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop_all()


def test_separate_worker_has_its_own_metrics(pg_cluster: Cluster, postgres_url: str) -> None:
    from tests.engine.test_processes import _free_port

    c = pg_cluster
    port = _free_port()
    c.env["FLOWYARD_METRICS_PORT"] = str(port)
    c.start("worker", "worker")
    auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    work = _workload(c.base)
    rows = _settled(postgres_url)
    # The token is required once set, loopback or not.
    assert httpx.get(f"{c.base}/metrics").status_code == 403
    assert httpx.get(f"{c.base}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
    api = samples(httpx.get(f"{c.base}/metrics", headers=auth).text)
    worker_url = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(worker_url).status_code == 403
    assert httpx.get(worker_url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    r = httpx.get(worker_url, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    engine = samples(r.text)
    _check_counts(api, engine, work, rows)
    # The API process runs no engine: it counted no executions.
    assert not any(name.startswith("flowyard_executions_") and v for (name, _l), v in api.items())
    c.stop_all()
    _check_logs(c.log("api"), work["secrets"])
    for line in c.log("worker").splitlines():
        json.loads(line)
    for secret in work["secrets"]:
        assert secret not in c.log("worker")
