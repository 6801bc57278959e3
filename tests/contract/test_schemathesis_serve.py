"""schemathesis against a real ``flowyard serve`` on SQLite and on PostgreSQL: every phase
(examples, coverage, fuzzing, stateful) and every check, a fixed seed, deterministic
generation, bounded by ``FLOWYARD_SCHEMATHESIS_SECONDS`` (default 60) per database.

Three identities: the administrator (the run's default) and one member of each of two
tenants, named as peers so ``object_level_authorization`` replays one tenant's reads as the
other. What is left out, and why, is in ``exclusions.toml`` next to this file, and nowhere
else. The run goes through schemathesis' own command line, as a user of the API would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import httpx
import pytest

from flowyard.iam import permissions as perms
from flowyard.webhooks.handler import MAX_WAIT
from tests.conftest import flow_body
from tests.contract.serve import ADMIN, Server, bin_path

pytestmark = [pytest.mark.slow]

HERE = Path(__file__).parent
SEED = 20261205
SECONDS = int(os.environ.get("FLOWYARD_SCHEMATHESIS_SECONDS", "60"))


def _seed(base: str) -> dict[str, str]:
    """Two tenants with a member each, a flow each; API tokens for the three identities."""
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post("/login", json={"username": ADMIN[0], "password": ADMIN[1]})
        assert r.status_code == 200, r.text
        admin = {"Authorization": f"Bearer {r.json()['token']}"}
        tokens: dict[str, str] = {}
        for name in ("alice", "bob"):
            r = c.post("/tenants", json={"name": f"tenant of {name}"}, headers=admin)
            assert r.status_code == 201, r.text
            tenant = r.json()["id"] if "id" in r.json() else r.json()["data"]["id"]
            user = {
                "username": f"{name}@example.com",
                "password": f"{name} has a long password",
                "tenant": tenant,
                "permissions": list(perms.MEMBER_DEFAULT),
            }
            r = c.post("/api/users", json=user, headers=admin)
            assert r.status_code == 201, r.text
            r = c.post("/login", json={"username": user["username"], "password": user["password"]})
            assert r.status_code == 200, r.text
            session = {"Authorization": f"Bearer {r.json()['token']}"}
            r = c.post("/tokens", json={"description": "schemathesis"}, headers=session)
            assert r.status_code == 201, r.text
            tokens[name] = r.json()["token"] if "token" in r.json() else r.json()["data"]["token"]
            r = c.post(
                "/flows",
                json=flow_body(f"{name}'s flow"),
                headers={"Authorization": f"Bearer {tokens[name]}"},
            )
            assert r.status_code == 201, r.text
        r = c.post("/tokens", json={"description": "schemathesis"}, headers=admin)
        assert r.status_code == 201, r.text
        tokens["admin"] = r.json()["token"] if "token" in r.json() else r.json()["data"]["token"]
        return tokens


def _config(tmp: Path, tokens: dict[str, str]) -> tuple[Path, list[str]]:
    """schemathesis.toml and the --exclude-checks list, from exclusions.toml."""
    exclusions = tomllib.loads((HERE / "exclusions.toml").read_text())
    for entry in [
        *exclusions.get("checks", []),
        *exclusions.get("operations", []),
        *exclusions.get("expected_statuses", []),
    ]:
        assert entry.get("reason"), f"an exclusion without a reason: {entry}"
    wfc = {
        "auth": [
            {"name": name, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {token}"}]}
            for name, token in tokens.items()
        ]
    }
    wfc_path = tmp / "identities.json"
    wfc_path.write_text(json.dumps(wfc))
    lines = [
        "[auth.wfc]",
        f"path = {json.dumps(str(wfc_path))}",
        'user = "admin"',
        'peers = ["alice", "bob"]',
        "",
    ]
    for op in exclusions.get("operations", []):
        lines += [
            "[[operations]]",
            f"include-name = {json.dumps(op['method'] + ' ' + op['path'])}",
            "enabled = false",
            "",
        ]
    for op in exclusions.get("expected_statuses", []):
        lines += [
            "[[operations]]",
            f"include-name = {json.dumps(op['method'] + ' ' + op['path'])}",
            f"checks.{op['check']}.expected-statuses = {json.dumps(op['statuses'])}",
            "",
        ]
    config = tmp / "schemathesis.toml"
    config.write_text("\n".join(lines))
    return config, [c["name"] for c in exclusions.get("checks", [])]


def _run(server: Server, tmp: Path) -> None:
    tokens = _seed(server.base)
    config, excluded = _config(tmp, tokens)
    report = tmp / "report"
    cmd = [
        bin_path("schemathesis"),
        "--config-file",
        str(config),
        "run",
        f"{server.base}/openapi.json",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--checks",
        "all",
        "--exclude-checks",
        ",".join(excluded),
        "--seed",
        str(SEED),
        "--generation-deterministic",
        "--max-time",
        str(SECONDS),
        "--workers",
        "1",
        # Longer than the longest webhook ?wait= the document allows: a slow answer is not a failure.
        "--request-timeout",
        str(int(MAX_WAIT) + 60),
        "--max-redirects",
        "0",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(report),
    ]
    # --max-time bounds the fuzzing and stateful phases; the rest is bounded here, generously.
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS * 6 + 300, cwd=tmp)
    output = done.stdout + done.stderr
    (tmp / "schemathesis.out").write_text(output)
    assert done.returncode == 0, output[-20000:]
    assert "No issues found" in output or "passed" in output, output[-5000:]
    assert server.proc.poll() is None, server.log.read_text(errors="replace")


def test_schemathesis(server: Server, tmp_path: Path) -> None:
    _run(server, tmp_path)
