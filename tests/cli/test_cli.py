"""The ``flowyard`` command as real subprocesses, against a temporary SQLite data dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import httpx
import pytest

from flowyard.app import create_app
from flowyard.cli import main
from flowyard.config import Settings
from flowyard.db.session import Database
from tests.conftest import flow_body


def _executable() -> str:
    beside = Path(sys.executable).parent / "flowyard"
    found = str(beside) if beside.exists() else shutil.which("flowyard")
    assert found, "the flowyard console script is not installed"
    return found


def run(*args: str, env: dict[str, str] | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [_executable(), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    if ok:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:  # internal (`_api`: an API process of a multi-process serve)
            continue
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
    return paths


pytestmark = pytest.mark.slow  # every call starts a Python process (~3 s each on a busy machine)


def test_help_of_every_command() -> None:
    top = run("--help")
    assert "Usage: flowyard" in top.stdout
    paths = _command_paths(main)
    assert ("templates", "import") in paths and ("tokens", "create") in paths
    for path in paths:
        assert path[0] in top.stdout
        proc = run(*path, "--help")
        assert f"Usage: flowyard {' '.join(path)}" in proc.stdout, path


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWYARD_")}
    env["FLOWYARD_DATA_DIR"] = str(data_dir)
    env["FLOWYARD_LOG_LEVEL"] = "warning"
    return env


async def test_bootstrap_with_the_cli(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    assert "database at head" in run("migrate", env=env).stdout
    tenant_id = run("tenants", "create", "Acme", env=env).stdout.strip()
    assert len(tenant_id) == 24
    user = json.loads(
        run(
            "users",
            "create",
            "--username",
            "Ops@Acme.example",
            "--password",
            "long enough pw",
            "--tenant",
            "Acme",
            env=env,
        ).stdout
    )
    assert (user["username"], user["tenant"]) == ("ops@acme.example", tenant_id)
    assert "flowTemplates.read" in user["permissions"]
    token = json.loads(
        run("tokens", "create", "--user", "ops@acme.example", "--description", "ci", env=env).stdout
    )
    assert set(token) == {"id", "token", "expiresAt"}

    templates: list[dict[str, Any]] = [
        {**flow_body("Global template"), "status": "published", "tags": ["erp"], "shared": True},
        {**flow_body("Acme template"), "owners": [{"id": tenant_id, "type": "tenant"}]},
        # No owners and not shared (SPEC §4): administrators only.
        {**flow_body("Admins only")},
        {**flow_body("Someone else's"), "owners": [{"id": "another-tenant", "type": "tenant"}]},
    ]
    file = tmp_path / "templates.json"
    file.write_text(json.dumps(templates), encoding="utf-8")
    ids = run("templates", "import", str(file), env=env).stdout.split()
    assert len(ids) == 4

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([flow_body("fine"), {"name": "no graph"}]), encoding="utf-8")
    proc = run("templates", "import", str(bad), env=env, ok=False)
    assert proc.returncode != 0
    assert "[1].type" in proc.stderr and "[1].graph" in proc.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{nope", encoding="utf-8")
    assert "not valid JSON" in run("templates", "import", str(garbage), env=env, ok=False).stderr

    assert "ops@acme.example" in run("users", "list", env=env).stdout

    # What the CLI wrote is served over HTTP, and the printed token works.
    settings = Settings(data_dir=tmp_path / "data")
    db = Database(settings.resolved_database_url())
    try:
        app = create_app(settings, db=db, run_engine=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cli.test") as client:
            headers = {"Authorization": f"Bearer {token['token']}"}
            r = await client.get("/templates?sort=name", headers=headers)
            assert r.status_code == 200, r.text
            assert [t["name"] for t in r.json()["data"]] == ["Acme template", "Global template"]
            assert sorted(t["id"] for t in r.json()["data"]) == sorted(ids[:2])
            r = await client.get("/api/users", headers=headers)
            assert [u["username"] for u in r.json()] == ["ops@acme.example"]
            r = await client.post(f"/templates/{ids[0]}/flows", headers=headers)
            assert r.status_code == 201, r.text
            assert r.json()["data"]["tenant"] == tenant_id
            r = await client.post(
                "/login", json={"username": "ops@acme.example", "password": "long enough pw"}
            )
            assert r.status_code == 200
    finally:
        await db.dispose()
