"""The code step in the engine, with its real runner process (one, so every tenant's code runs
in the same process), on SQLite and PostgreSQL: transforms, many messages, ``ctx.log`` entries
in ``GET /logs``, exceptions with their position; an endless loop, a memory hog, deep
recursion and a huge string each fail only their step while ``/health`` answers and the other
tenant's executions complete; globals, prototypes and built-ins one tenant's code changes are
never seen by the next execution or by another tenant's code."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowyard.config import Settings
from tests.conftest import Account, Factory, flow_body
from tests.engine.test_containment import HealthSampler, _finished
from tests.engine.test_engine_e2e import active_flow, finished
from tests.engine.test_processes import Cluster, _active_flow, _login

Client = httpx.AsyncClient
CPU = 0.5
MEMORY = 32


@pytest.fixture
def engine_settings(tmp_path: Path, db_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path,
        database_url=db_url,
        poll_interval=0.05,
        scheduler_interval=0.2,
        lease_seconds=5,
        stop_grace_seconds=2,
        step_timeout=5,
        webhook_group_commit_ms=1,
        runners=1,  # every tenant's code in the same runner process: the hardest case for leaks
        runner_surge=0,  # (one tenant after another: a runner holds one tenant at a time)
        code_cpu_seconds=CPU,
        code_memory_mb=MEMORY,
    )


def code_flow(name: str, source: str, *, sink: bool = True) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": "in", "componentId": "webhook"},
        {"id": "calc", "componentId": "code", "fields": {"source": source}},
    ]
    edges = [{"source": "in", "target": "calc"}]
    if sink:
        nodes.append({"id": "out", "componentId": "log", "fields": {"includeData": True}})
        edges.append({"source": "calc", "target": "out"})
    return flow_body(name=name, graph={"nodes": nodes, "edges": edges})


async def hook(c: Client, fid: str, body: Any) -> str:
    r = await c.post(f"/webhooks/{fid}", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["data"]["executionId"])


TRANSFORM = """
function main(data, ctx) {
  ctx.log('warn', 'splitting ' + data.items.length + ' items');
  let running = 0;
  return data.items.map((item, i) => {
    running += item.price;
    return {sku: item.sku.toUpperCase(), running, index: i};
  });
}"""

HOSTILE = {
    "loop": "function main() {\n  for (;;) {}\n}",
    "hog": "function main() {\n  const a = [];\n  for (;;) a.push('x'.repeat(1024) + a.length);\n}",
    "recursion": "function main(d) {\n  return main(d) + 1;\n}",
    "string": "function main() {\n  let s = 'x';\n  for (;;) s += s;\n}",
    "throws": "function main(d) {\n  const user = d.user;\n  return user.name.first;\n}",
}
OUT_OF_MEMORY = f"exceeded the {MEMORY} MiB memory limit of a code step (FLOWYARD_CODE_MEMORY_MB)"
EXPECTED = {
    "loop": f"step calc failed: exceeded the {CPU:g} s CPU limit of a code step (FLOWYARD_CODE_CPU_SECONDS)",
    "hog": f"step calc failed: {OUT_OF_MEMORY}",
    "recursion": "step calc failed: RangeError: Maximum call stack size exceeded (line 2, column 15)",
    "throws": "step calc failed: TypeError: cannot read property 'first' of undefined (line 3, column 10)",
}

POLLUTER = """
globalThis.loaded = (globalThis.loaded || 0) + 1;
function main(data) {
  globalThis.secret = data.secret;
  Object.prototype.stolen = data.secret;
  Array.prototype.map = function () { return ['hijacked'] };
  JSON.parse = function () { return {hijacked: true} };
  Math.random = function () { return 4 };
  return {loaded};
}"""

READER = """
function main(data) {
  return {
    secret: typeof secret, stolen: ({}).stolen ?? null, loaded: typeof loaded,
    map: [1, 2].map(x => x * 10), parsed: JSON.parse('{"a": 1}'), random: Math.random() < 1,
    data,
  };
}"""


async def test_code_steps_are_contained(engine_client: Client, factory: Factory) -> None:
    c = engine_client
    attacker = await factory.user(tenant=await factory.tenant("attacker"))
    victim = await factory.user(tenant=await factory.tenant("victim"))

    transform = await active_flow(c, victim, code_flow("transform", TRANSFORM))
    reader = await active_flow(c, victim, code_flow("reader", READER))
    hostile = {k: await active_flow(c, attacker, code_flow(k, v)) for k, v in HOSTILE.items()}
    polluter = await active_flow(c, attacker, code_flow("polluter", POLLUTER))

    # The API answers while the runner is busy with the attacker's code: probes run from before
    # the first webhook until every attack has ended (how many fit in depends on the machine).
    probes: list[int] = []
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            probes.append((await c.get("/health")).status_code)
            await asyncio.sleep(0.05)

    prober = asyncio.create_task(probe())
    await asyncio.sleep(0)  # the first probe is on its way before the first attack

    # Interleaved: each victim execution is queued right behind an attacker's.
    victims: list[tuple[str, str]] = []
    attacks: dict[str, str] = {}
    for name, fid in hostile.items():
        attacks[name] = await hook(c, fid, {"user": {}})
        victims.append(("reader", await hook(c, reader, {"n": name})))
    for i in range(3):
        attacks[f"polluter{i}"] = await hook(c, polluter, {"secret": f"attacker-secret-{i}"})
        victims.append(("reader", await hook(c, reader, {"n": i})))
    items = [{"sku": "a", "price": 1}, {"sku": "b", "price": 2}, {"sku": "c", "price": 4}]
    victims.append(("transform", await hook(c, transform, {"items": items})))

    for name in HOSTILE:
        await finished(c, attacker, attacks[name])
    stop.set()
    await prober
    assert probes and set(probes) == {200}, probes

    for kind, eid in victims:
        e = await finished(c, victim, eid)
        assert e["status"] == "succeeded", e
        if kind == "reader":
            data = e["result"]["data"]
            assert data["secret"] == "undefined" and data["stolen"] is None and data["loaded"] == "undefined"
            assert data["map"] == [10, 20] and data["parsed"] == {"a": 1} and data["random"] is True
    # The polluter itself starts from nothing every time: its top-level code ran once per run.
    for i in range(3):
        e = await finished(c, attacker, attacks[f"polluter{i}"])
        assert (e["status"], e["result"]) == ("succeeded", {"data": {"loaded": 1}}), e

    for name, expected in EXPECTED.items():
        e = await finished(c, attacker, attacks[name])
        assert e["status"] == "failed", e
        # Out of memory, QuickJS may have no memory left for the error object: it throws null.
        assert e["error"] in (expected, f"{expected}, or main threw null"), e
        failed = [s for s in e["steps"] if s["status"] == "failed"]
        assert [s["nodeId"] for s in failed] == ["calc"]
    e = await finished(c, attacker, attacks["string"])
    assert e["status"] == "failed"
    assert e["error"] in (
        "step calc failed: InternalError: string too long (line 3, column 17)",
        f"step calc failed: {OUT_OF_MEMORY}",
        f"step calc failed: {OUT_OF_MEMORY}, or main threw null",
    ), e

    # Many messages: three out of the code step, each through the log step.
    e = await finished(c, victim, victims[-1][1])
    steps = {s["nodeId"]: s for s in e["steps"]}
    assert steps["calc"]["messagesOut"] == 3 and steps["out"]["runs"] == 3
    assert e["result"] == {"data": {"sku": "C", "running": 7, "index": 2}}
    r = await c.get(
        "/logs",
        params={"filter[tenant]": victim.tenant, "filter[executionId]": victims[-1][1], "page[size]": 100},
        headers=victim.headers,
    )
    assert r.status_code == 200, r.text
    mine = [(x["level"], x["message"]) for x in r.json()["data"] if x["stepId"] == "calc"]
    assert ("warn", "splitting 3 items") in mine
    entry = next(x for x in r.json()["data"] if x["message"] == "splitting 3 items")
    assert (entry["componentId"], entry["flowId"]) == ("code", transform)

    # After all that, the runner still serves: a fresh execution of each tenant succeeds.
    again = await finished(c, victim, await hook(c, reader, {"n": "after"}))
    assert again["status"] == "succeeded" and again["result"]["data"]["data"] == {"n": "after"}
    assert (await c.get("/health")).status_code == 200


async def test_two_tenants_code_never_shares_globals(engine_client: Client, factory: Factory) -> None:
    """Each tenant's code writes its own marker into every shared place it can reach, then
    reports what it found there: nothing from the other tenant, ever, however they interleave."""
    source = """
function main(data) {
  const seen = [globalThis.marker, Object.prototype.marker, String.prototype.marker,
                Array.prototype.marker, globalThis.__proto__.marker].filter(x => x !== undefined);
  globalThis.marker = data.me; Object.prototype.marker = data.me; String.prototype.marker = data.me;
  Array.prototype.marker = data.me;
  return {seen: seen.map(String)};
}"""
    accounts: list[Account] = []
    flows: list[str] = []
    for name in ("one", "two"):
        who = await factory.user(tenant=await factory.tenant(name))
        accounts.append(who)
        flows.append(await active_flow(engine_client, who, code_flow(name, source, sink=False)))
    runs: list[tuple[Account, str]] = []
    for i in range(6):
        for who, fid in zip(accounts, flows, strict=True):
            runs.append((who, await hook(engine_client, fid, {"me": f"{who.tenant}-{i}"})))
    results = await asyncio.gather(*(finished(engine_client, who, eid) for who, eid in runs))
    for e in results:
        assert (e["status"], e["result"]) == ("succeeded", {"data": {"seen": []}}), e


@pytest.mark.slow
def test_code_steps_are_contained_in_a_real_serve(tmp_path: Path) -> None:
    """The same attacks against ``flowyard serve`` (SQLite, one runner process): ``/health``,
    probed from a process of its own, never fails, and the other tenant's executions queued
    between the attacks all succeed."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'flowyard.db'}"
    c = Cluster(url, tmp_path)
    c.env.update({"FLOWYARD_CODE_CPU_SECONDS": str(CPU), "FLOWYARD_CODE_MEMORY_MB": str(MEMORY)})
    c.start("serve", "serve")
    try:
        c.wait_ready()
        headers = _login(c)
        tenants = [
            httpx.post(f"{c.base}/tenants", json={"name": n}, headers=headers).json()["data"]["id"]
            for n in ("attacker", "victim")
        ]
        attacks = {
            name: _active_flow(c, headers, {**code_flow(name, HOSTILE[name]), "tenant": tenants[0]})
            for name in ("loop", "hog", "recursion")
        }
        polluter = _active_flow(c, headers, {**code_flow("polluter", POLLUTER), "tenant": tenants[0]})
        reader = _active_flow(c, headers, {**code_flow("reader", READER), "tenant": tenants[1]})
        with contextlib.closing(HealthSampler(c.base)) as sampler, httpx.Client(base_url=c.base) as anonymous:

            def post(fid: str, body: Any) -> str:
                r = anonymous.post(f"/webhooks/{fid}", json=body)
                assert r.status_code == 202, r.text
                return str(r.json()["data"]["executionId"])

            hostile, victims = [], []
            for round_ in range(3):
                for fid in (*attacks.values(), polluter):
                    hostile.append(post(fid, {"secret": f"s{round_}"}))
                    victims.append(post(reader, {"n": round_}))
            deadline = time.monotonic() + 120  # a liveness bound on a shared machine
            done: dict[str, tuple[str, str | None]] = {}
            while time.monotonic() < deadline and len(done) < len(hostile) + len(victims):
                done = _finished(url, [*hostile, *victims])
                time.sleep(0.3)
            sampler.stop()
        assert len(done) == len(hostile) + len(victims), c.log("serve")[-3000:]
        assert {done[v] for v in victims} == {("succeeded", None)}
        assert sum(1 for h in hostile if done[h][0] == "failed") == 9  # loop, hog, recursion x 3
        assert sum(1 for h in hostile if done[h][0] == "succeeded") == 3  # the polluter
        results = [
            httpx.get(f"{c.base}/executions/{v}", headers=headers).json()["data"]["result"]["data"]
            for v in victims
        ]
        assert all(r["secret"] == "undefined" and r["stolen"] is None for r in results), results
        assert len(sampler.latencies) > 10
        assert max(sampler.latencies) < 1.0, "a /health probe failed while code steps ran"
        assert "Traceback" not in c.log("serve"), c.log("serve")[-3000:]
    finally:
        c.stop_all()
