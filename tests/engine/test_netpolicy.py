"""The outbound network policy.

Only loopback is ever connected to here. Private, CGNAT, metadata and public forms are
proven refused at ``classify`` (the function that decides); end to end, only loopback
spellings are used, and the rebinding tests are built so that even a wrong client could
reach nothing but loopback.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from flowyard.components.netpolicy import NetworkPolicy, build_client, classify
from flowyard.config import Settings
from flowyard.queue.store import Outcome
from tests.conftest import Account, flow_body
from tests.engine.test_engine_e2e import active_flow, finished
from tests.engine.test_graph import run
from tests.netfixtures import MakeClient, configured, redirect_path, upstream_server

__all__ = ["configured"]

DENIED = [
    # loopback, unspecified, "this network"
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "this network"),
    ("::", "unspecified"),
    # private
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.0.1", "private"),
    ("192.168.255.255", "private"),
    # link-local, CGNAT, unique-local
    ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("fc00::1", "unique-local"),
    ("fd12:3456::1", "unique-local"),
    ("fec0::1", "site-local"),
    # multicast, broadcast, reserved, documentation, benchmarking
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
    ("255.255.255.255", "reserved"),
    ("240.0.0.1", "reserved"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("2001:db8::1", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("2001:2::1", "benchmarking"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("192.88.99.1", "6to4 relay"),
    ("100::1", "discard-only"),
    # cloud metadata
    ("169.254.169.254", "cloud metadata"),
    ("169.254.170.2", "cloud metadata"),
    ("169.254.0.23", "cloud metadata"),
    ("fd00:ec2::254", "cloud metadata"),
    ("100.100.100.200", "Alibaba"),
    ("192.0.0.192", "Oracle"),
    ("168.63.129.16", "Azure"),
    # IPv4-mapped
    ("::ffff:127.0.0.1", "IPv4-mapped form of 127.0.0.1: loopback"),
    ("::ffff:10.1.2.3", "IPv4-mapped form of 10.1.2.3: private"),
    ("::ffff:a9fe:a9fe", "IPv4-mapped form of 169.254.169.254: cloud metadata"),
    ("::ffff:100.100.100.200", "Alibaba"),
    ("::ffff:0.0.0.0", "unspecified"),
    # IPv4-compatible
    ("::a9fe:a9fe", "IPv4-compatible form of 169.254.169.254: cloud metadata"),
    ("::127.0.0.1", "IPv4-compatible form of 127.0.0.1: loopback"),
    ("::c0a8:101", "IPv4-compatible form of 192.168.1.1: private"),
    # NAT64
    ("64:ff9b::7f00:1", "NAT64 form of 127.0.0.1: loopback"),
    ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"),
    ("64:ff9b::10.0.0.1", "NAT64 form of 10.0.0.1: private"),
    ("64:ff9b:1::a9fe:a9fe", "local-use NAT64"),
    ("64:ff9b:1:ffff::1", "local-use NAT64"),
    # 6to4 and Teredo
    ("2002:7f00:1::1", "6to4 form of 127.0.0.1: loopback"),
    ("2002:a9fe:a9fe::", "6to4 form of 169.254.169.254"),
    ("2002:c0a8:101::1", "6to4 form of 192.168.1.1"),
    # Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted: 80ff:fffe)
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo form of 127.0.0.1: loopback"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above CGNAT
    "172.15.255.255",
    "172.32.0.0",
    "169.253.255.255",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    "::808:808",
    "64:ff9b::808:808",
    "2002:808:808::1",
]


@pytest.mark.parametrize(("address", "reason"), DENIED)
def test_classify_denies(address: str, reason: str) -> None:
    verdict = classify(address)
    assert verdict is not None and reason in verdict, verdict
    assert NetworkPolicy().check(address) == verdict


@pytest.mark.parametrize("address", PUBLIC)
def test_classify_allows_public_unicast(address: str) -> None:
    assert classify(address) is None


def test_allow_list_opens_only_its_networks() -> None:
    policy = NetworkPolicy(["10.1.0.0/16", "169.254.169.254/32", "fd12::/16"])
    for opened in ("10.1.2.3", "::ffff:10.1.2.3", "169.254.169.254", "::ffff:169.254.169.254", "fd12::1"):
        assert policy.check(opened) is None, opened
    for still in ("10.2.0.1", "169.254.169.253", "192.168.1.1", "127.0.0.1", "fd13::1", "fe80::1"):
        assert policy.check(still) is not None, still
    loopback = NetworkPolicy(["127.0.0.0/8"])
    # 0.0.0.0 reaches this host: it opens with loopback (and is connected to as 127.0.0.1).
    assert loopback.check("0.0.0.0") is None and loopback.check("::ffff:127.0.0.2") is None
    assert loopback.check("::1") is not None


def test_allow_networks_setting_parses_lists() -> None:
    assert Settings(http_allow_networks="127.0.0.0/8, ::1").http_allow_networks == ["127.0.0.0/8", "::1"]  # type: ignore[arg-type]
    assert Settings(http_allow_networks='["10.0.0.0/8"]').http_allow_networks == ["10.0.0.0/8"]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not appear to be"):
        Settings(http_allow_networks="10.0.0.0/33")  # type: ignore[arg-type]


# -- the http component through the shared client, without a database -----------------


async def run_http(client: httpx.AsyncClient, settings: Settings, url: str) -> Outcome:
    nodes = [{"id": "in"}, {"id": "h", "componentId": "http", "fields": {"url": url}}]
    return await run(client, nodes, [{"source": "in", "target": "h"}], {}, settings)


class StubResolver:
    """Answers each call with the next list of addresses (a rebinding DNS server)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


async def test_rebinding_connects_to_the_vetted_address() -> None:
    # Only 127.0.0.1 is allowed and listens; the second answer (127.0.0.2) is denied and
    # unserved, so a client that resolved twice would fail here (and still reach only loopback).
    settings = Settings(http_allow_networks=["127.0.0.1/32"], step_timeout=5)
    resolver = StubResolver(["127.0.0.1"], ["127.0.0.2"])
    with upstream_server() as up:
        async with build_client(settings, resolver=resolver) as client:
            out = await run_http(client, settings, f"http://rebind.test:{up.port}/probe")
    assert out.status == "succeeded", out.error
    assert out.result["data"]["status"] == 200 and out.result["data"]["body"] == {"ok": True}
    assert up.hits == ["/probe"]
    assert resolver.calls == [("rebind.test", up.port)]


async def test_rebinding_refuses_a_denied_first_answer_without_connecting() -> None:
    # The first answer (127.0.0.2) is outside the allow-list: refused before any connect, even
    # though the second answer would be allowed and is served.
    settings = Settings(http_allow_networks=["127.0.0.1/32"], step_timeout=5)
    resolver = StubResolver(["127.0.0.2"], ["127.0.0.1"])
    with upstream_server() as up:
        async with build_client(settings, resolver=resolver) as client:
            out = await run_http(client, settings, f"http://rebind.test:{up.port}/probe")
    assert out.status == "failed"
    assert "refusing to connect to rebind.test: 127.0.0.2 (loopback (127.0.0.0/8))" in (out.error or "")
    assert up.hits == [] and len(resolver.calls) == 1


async def test_mixed_answers_connect_only_to_allowed_addresses() -> None:
    settings = Settings(http_allow_networks=["127.0.0.1/32"], step_timeout=5)
    resolver = StubResolver(["127.0.0.2", "127.0.0.1"])
    with upstream_server() as up:
        async with build_client(settings, resolver=resolver) as client:
            out = await run_http(client, settings, f"http://mixed.test:{up.port}/m")
    assert out.status == "succeeded", out.error
    assert up.hits == ["/m"]


async def test_metadata_address_refused_before_connecting() -> None:
    # The literal is classified and refused; no socket is opened (no resolver involved).
    settings = Settings(step_timeout=5)
    resolver = StubResolver(["127.0.0.1"])
    async with build_client(settings, resolver=resolver) as client:
        out = await run_http(client, settings, "http://127.0.0.1:9/latest/meta-data/")
    assert out.status == "failed" and "refusing to connect" in (out.error or "")


async def test_followed_redirects_are_vetted_at_each_hop() -> None:
    # The http component follows no redirects; a client user that does gets every hop vetted.
    settings = Settings(http_allow_networks=["127.0.0.1/32"], step_timeout=5)
    with upstream_server() as up:
        async with build_client(settings) as client:
            r = await client.get(f"http://127.0.0.1:{up.port}{redirect_path('/landed')}")
            assert r.status_code == 302  # not followed by default
            ok = await client.get(
                f"http://127.0.0.1:{up.port}{redirect_path(f'http://127.0.0.1:{up.port}/landed')}",
                follow_redirects=True,
            )
            assert ok.status_code == 200 and ok.json() == {"ok": True}
            # 127.0.0.2 is loopback but not listed (and nothing listens there): refused, not tried.
            with pytest.raises(httpx.ConnectError, match=r"refusing to connect to 127\.0\.0\.2"):
                await client.get(
                    f"http://127.0.0.1:{up.port}{redirect_path(f'http://127.0.0.2:{up.port}/inside')}",
                    follow_redirects=True,
                )
    assert "/landed" in up.hits and "/inside" not in up.hits


def test_build_client_works_in_any_loop_and_thread() -> None:
    """Runner processes build their client wherever they run: no state is bound to a loop
    until the client is used, and each loop gets its own client."""
    settings = Settings(http_allow_networks=["127.0.0.1/32"], step_timeout=5)
    results: list[int] = []

    def in_thread(port: int) -> None:
        client = build_client(settings)  # built with no running loop

        async def use() -> None:
            async with client:
                results.append((await client.get(f"http://127.0.0.1:{port}/t")).status_code)

        asyncio.run(use())

    with upstream_server() as up:
        threads = [threading.Thread(target=in_thread, args=(up.port,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == [200, 200, 200]


async def test_proxy_environment_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    settings = Settings(http_allow_networks=["127.0.0.0/8"], step_timeout=5)
    with upstream_server() as up:
        async with build_client(settings) as client:
            out = await run_http(client, settings, f"http://127.0.0.1:{up.port}/direct")
    assert out.status == "succeeded", out.error
    assert up.hits == ["/direct"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_response_body_is_capped(chunked: bool) -> None:
    settings = Settings(
        http_allow_networks=["127.0.0.0/8"],
        step_timeout=5,
        http_max_response_bytes=1024 * 1024,
        max_result_bytes=2 * 1024 * 1024,  # the http step is the last: its output is the result
    )
    with upstream_server() as up:
        up.chunked = chunked
        async with build_client(settings) as client:
            up.body = b'"' + b"x" * (1024 * 1024 - 2) + b'"'  # exactly the limit: read
            ok = await run_http(client, settings, f"http://127.0.0.1:{up.port}/fits")
            up.body = b'"' + b"x" * (3 * 1024 * 1024) + b'"'
            big = await run_http(client, settings, f"http://127.0.0.1:{up.port}/big")
    assert ok.status == "succeeded", ok.error
    assert len(ok.result["data"]["body"]) == 1024 * 1024 - 2
    assert big.status == "failed"
    assert "the response body exceeds the 1 MiB limit (FLOWYARD_HTTP_MAX_RESPONSE_BYTES)" in (big.error or "")


# -- end to end: a flow's http step, triggered by an anonymous webhook ------------------

SPELLINGS = ["127.1", "0x7f000001", "2130706433", "[::ffff:127.0.0.1]", "localhost", "0.0.0.0", "127.0.0.1"]


def probe_flow(port: int) -> dict[str, Any]:
    return flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {
                    "id": "call",
                    "componentId": "http",
                    "fields": {"url": f"http://{{{{ host }}}}:{port}/probe"},
                },
            ],
            "edges": [{"source": "in", "target": "call"}],
        }
    )


async def _probe_all(c: httpx.AsyncClient, admin: Account, port: int) -> dict[str, dict[str, Any]]:
    fid = await active_flow(c, admin, probe_flow(port))
    ids = {}
    for host in SPELLINGS:
        r = await c.post(f"/webhooks/{fid}", json={"host": host})
        assert r.status_code == 202, r.text
        ids[host] = r.json()["data"]["executionId"]
    return {host: await finished(c, admin, eid) for host, eid in ids.items()}


async def test_loopback_spellings_refused_by_default(configured: MakeClient, admin: Account) -> None:
    c = await configured()
    with upstream_server() as up:
        results = await _probe_all(c, admin, up.port)
    assert up.hits == []
    for host, e in results.items():
        assert e["status"] == "failed", (host, e)
        assert "refusing to connect" in e["error"] and "FLOWYARD_OUTBOUND_ALLOW_NETWORKS" in e["error"], e[
            "error"
        ]


async def test_loopback_spellings_allowed_when_listed(configured: MakeClient, admin: Account) -> None:
    c = await configured(http_allow_networks=["127.0.0.0/8", "::1/128"])
    with upstream_server() as up:
        results = await _probe_all(c, admin, up.port)
    for host, e in results.items():
        assert e["status"] == "succeeded", (host, e)
        assert e["result"]["data"]["status"] == 200
    assert up.hits == ["/probe"] * len(SPELLINGS)
