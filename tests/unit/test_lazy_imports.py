"""Connector client libraries are imported on first use (issue 19, docs/performance.md "Memory per
process"): neither the API/engine process nor a runner loads them to start, to list the components
with their fields' JSON schema, or to validate a flow's fields. Each check runs in a fresh
interpreter, so what the test process itself imported does not count."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

# Client libraries a process loads only when a step or trigger of that kind talks to its server.
CONNECTOR_LIBRARIES = (
    "aiomqtt",
    "paho",
    "aiormq",
    "pamqp",
    "redis",
    "aiomysql",
    "pymysql",
    "asyncpg",
    "aiosmtplib",
    "croniter",
    "dateutil",
    "quickjs",
)
# Loaded only by `flowyard migrate` and the child process `flowyard serve` upgrades the schema in.
MIGRATION_LIBRARIES = ("alembic", "mako")
# ... and what a runner never needs at all: it has no database and no HTTP server.
SERVER_LIBRARIES = ("sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "aiosqlite")

REGISTRY = """
from flowyard.components import builtins
from flowyard.components.registry import Registry

registry = Registry.load(builtins.ALL)
assert not registry.failures, registry.failures
ids = {c.id for c in registry.all()}
assert {"amqp", "mqtt", "redis", "email", "sql", "code", "schedule"} <= ids, ids
for component in registry.all():
    component.fields_schema()  # what GET /components lists
checks = {
    "amqp": {"exchange": "orders", "routingKey": "{{ kind }}", "body": {"id": "id"}},
    "mqtt": {"topic": "orders/{{ kind }}", "qos": 1},
    "redis": {"key": "order:{{ id }}", "ttl": 60},
    "email": {"to": "'a@example.com'", "subject": "'hi'", "text": "'body'"},
}
for cid, fields in checks.items():
    assert registry.get(cid).validate_fields(fields) == [], (cid, registry.get(cid).validate_fields(fields))
assert registry.get("mqtt").validate_fields({"topic": "a/#"}) != []
"""

REPORT = """
import json, sys
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _loaded(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", code + REGISTRY + REPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_api_and_engine_process_loads_no_connector_library() -> None:
    loaded = _loaded("import flowyard.app, flowyard.enginehost, flowyard.server, flowyard.cli\n")
    unwanted = set(CONNECTOR_LIBRARIES) | set(MIGRATION_LIBRARIES)
    assert loaded.isdisjoint(unwanted), sorted(loaded & unwanted)


def test_a_runner_loads_no_connector_library_and_no_server_library() -> None:
    # What runner_process.main() imports before it serves (the module and its start-up imports).
    loaded = _loaded("import flowyard.runtime.runner_process, uvloop\nfrom flowyard.config import Settings\n")
    unwanted = set(CONNECTOR_LIBRARIES) | set(SERVER_LIBRARIES)
    assert loaded.isdisjoint(unwanted), sorted(loaded & unwanted)


def test_serve_upgrades_the_schema_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`flowyard serve` migrates through ``schema.upgrade_apart`` (so Alembic stays out of it):
    the child reaches head with the parent's environment, and its failure is an OpsError."""
    from flowyard.db import migrate
    from flowyard.ops import OpsError, schema

    monkeypatch.setenv("FLOWYARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLOWYARD_LOG_LEVEL", "warning")
    schema.upgrade_apart()
    with sqlite3.connect(tmp_path / "flowyard.db") as conn:
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision == migrate.script_head()
    # A database under a file: the child cannot create it.
    monkeypatch.setenv("FLOWYARD_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/flowyard.db/x.db")
    with pytest.raises(OpsError, match="schema upgrade failed"):
        schema.upgrade_apart()
