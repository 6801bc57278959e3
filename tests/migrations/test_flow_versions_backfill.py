"""Migration 0018: every flow stored before versions gets version 1 holding its graph, cron and
errorFlowId as stored, and its executions name version 1; executions of a deleted flow name none.
The downgrade removes it all and the upgrade is repeatable."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

PLAIN, CRON = "a" * 24, "b" * 24
GONE = "c" * 24  # executions of a flow deleted before the migration
ERROR_FLOW = PLAIN
GRAPHS = {
    PLAIN: {"nodes": [{"id": "in", "componentId": "webhook", "function": "receive"}], "edges": []},
    CRON: {"nodes": [{"id": "tick", "componentId": "log", "fields": {"level": "info"}}], "edges": []},
}


def _insert(url: str) -> None:
    sqlite = url.startswith("sqlite")
    now = "'2026-01-02 03:04:05'" if sqlite else "CAST('2026-01-02 03:04:05+00' AS timestamptz)"

    def js(param: str) -> str:
        return f":{param}" if sqlite else f"CAST(:{param} AS json)"

    def insert(conn: sa.Connection) -> None:
        for fid, cron, error_flow in ((PLAIN, None, None), (CRON, "*/5 * * * *", ERROR_FLOW)):
            conn.execute(
                sa.text(
                    "INSERT INTO flows (id, name, name_lc, type, cron, graph, owners, status,"
                    " status_changed_at, version, error_flow_id, created_at, updated_at) VALUES"
                    f" (:id, 'f', 'f', 'ordinary', :cron, {js('graph')}, {js('owners')}, 'inactive',"
                    f" {now}, 7, :err, {now}, {now})"
                ),
                {
                    "id": fid,
                    "cron": cron,
                    "graph": json.dumps(GRAPHS[fid]),
                    "owners": "[]",
                    "err": error_flow,
                },
            )
        for i, fid in enumerate((PLAIN, PLAIN, CRON, GONE)):
            conn.execute(
                sa.text(
                    "INSERT INTO executions (id, flow_id, flow_version, trigger, status, created_at,"
                    f" attempts) VALUES (:id, :f, 7, 'webhook', 'succeeded', {now}, 1)"
                ),
                {"id": f"{i:024x}", "f": fid},
            )
        conn.commit()

    _in_sync(url, insert)


def _read(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    def read(conn: sa.Connection) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        versions = {
            (fid, n): (json.loads(g) if isinstance(g, str) else g, cron, err, author)
            for fid, n, g, cron, err, author in conn.execute(
                sa.text(
                    "SELECT flow_id, number, CAST(graph AS TEXT), cron, error_flow_id, author"
                    " FROM flow_versions"
                )
            )
        }
        flows = dict(conn.execute(sa.text("SELECT id, history_version FROM flows")).all())
        executions = dict(conn.execute(sa.text("SELECT id, history_version FROM executions")).all())
        return versions, flows, executions

    return _in_sync(url, read)  # type: ignore[no-any-return]


def test_existing_flows_get_version_one(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0017")
    _insert(empty_url)
    migrate.upgrade(empty_url, "0018")
    versions, flows, executions = _read(empty_url)
    assert versions == {
        (PLAIN, 1): (GRAPHS[PLAIN], None, None, None),
        (CRON, 1): (GRAPHS[CRON], "*/5 * * * *", ERROR_FLOW, None),
    }
    assert flows == {PLAIN: 1, CRON: 1}
    assert executions == {f"{0:024x}": 1, f"{1:024x}": 1, f"{2:024x}": 1, f"{3:024x}": None}

    migrate.downgrade(empty_url, "0017")

    def tables(conn: sa.Connection) -> tuple[set[str], set[str], set[str]]:
        inspector = sa.inspect(conn)
        return (
            set(inspector.get_table_names()),
            {c["name"] for c in inspector.get_columns("flows")},
            {c["name"] for c in inspector.get_columns("executions")},
        )

    names, flow_columns, execution_columns = _in_sync(empty_url, tables)
    assert "flow_versions" not in names
    assert "history_version" not in flow_columns | execution_columns
    migrate.upgrade(empty_url, "0018")
    assert _read(empty_url)[1] == {PLAIN: 1, CRON: 1}
