"""Migration 0019 (issue 19): on a database filled at 0018, the list indexes of executions and
logs are built over the existing rows, the per-row scope index goes, the rows stay as they
were, and a member's list reads the new index in id order; down to 0018 and up again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

T1, T2 = "t" * 24, "u" * 24
LONER = "a" * 24
FLOW = "f" * 24
NEW = {
    "executions": {
        "ix_executions_flow_id",
        "ix_executions_flow_status_id",
        "ix_executions_tenant_id",
        "ix_executions_tenant_status_id",
        "ix_executions_owner_id",
        "ix_executions_owner_status_id",
    },
    "logs": {"ix_logs_tenant_step_id", "ix_logs_tenantless_user_id"},
}
GONE = {
    "executions": {"ix_executions_scope", "ix_executions_flow_status", "ix_executions_flow_id_id"},
    "logs": set(),
}


def _fill(url: str) -> None:
    when = datetime(2026, 11, 30, 12, tzinfo=UTC)
    sqlite = url.startswith("sqlite")

    def insert(conn: sa.Connection) -> None:
        for i in range(30):
            tenant = (T1, T2, None)[i % 3]
            conn.execute(
                sa.text(
                    "INSERT INTO executions (id, flow_id, flow_version, history_version, tenant,"
                    " owner_user, trigger, status, created_at, attempts)"
                    " VALUES (:id, :f, 1, 1, :t, :u, 'manual', :s, :c, 0)"
                ),
                {
                    "id": f"{i:024x}",
                    "f": FLOW,
                    "t": tenant,
                    "u": LONER,
                    "s": ("queued", "failed", "succeeded")[i % 3],
                    "c": when.isoformat() if sqlite else when,
                },
            )
            conn.execute(
                sa.text(
                    "INSERT INTO logs (timestamp, level, message, tenant, user_id, flow_id, execution_id)"
                    " VALUES (:c, 'info', 'ran', :t, :u, :f, :e)"
                ),
                {
                    "c": when.isoformat() if sqlite else when,
                    "t": tenant,
                    "u": LONER,
                    "f": FLOW,
                    "e": f"{i:024x}",
                },
            )
        conn.commit()

    _in_sync(url, insert)


def _state(url: str) -> tuple[dict[str, set[Any]], list[Any], list[Any]]:
    def read(conn: sa.Connection) -> tuple[dict[str, set[Any]], list[Any], list[Any]]:
        inspector = sa.inspect(conn)
        indexes: dict[str, set[Any]] = {
            t: {ix["name"] for ix in inspector.get_indexes(t)} for t in ("executions", "logs")
        }
        # Columns and partial predicates too: a migration that restored a name with another
        # definition would otherwise pass (Alembic's comparison does not look at predicates).
        shapes = {
            (
                t,
                ix["name"],
                tuple(ix["column_names"]),
                tuple(sorted((k, str(v)) for k, v in (ix.get("dialect_options") or {}).items())),
            )
            for t in ("executions", "logs")
            for ix in inspector.get_indexes(t)
        }
        indexes["shapes"] = shapes
        executions = conn.execute(
            sa.text("SELECT id, tenant, owner_user, status FROM executions ORDER BY id")
        ).all()
        logs = conn.execute(sa.text("SELECT id, tenant, user_id, execution_id FROM logs ORDER BY id")).all()
        return indexes, list(executions), list(logs)

    return _in_sync(url, read)


def test_list_indexes_over_existing_rows(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0018")
    _fill(empty_url)
    before_indexes, executions, logs = _state(empty_url)
    for table, names in NEW.items():
        assert not names & before_indexes[table]
        assert GONE[table] <= before_indexes[table]
    migrate.upgrade(empty_url, "0019")
    upgraded, executions_after, logs_after = _state(empty_url)
    assert (executions_after, logs_after) == (executions, logs)
    for table, names in NEW.items():
        assert names <= upgraded[table]
        assert not GONE[table] & upgraded[table]
    if empty_url.startswith("sqlite"):

        def plan(conn: sa.Connection) -> list[str]:
            rows = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT id FROM executions WHERE tenant = ? AND status = ?"
                " ORDER BY id DESC LIMIT 10",
                (T1, "failed"),
            ).all()
            return [str(r[-1]) for r in rows]

        lines = _in_sync(empty_url, plan)
        assert any("ix_executions_tenant_status_id" in line for line in lines), lines
        assert not any("TEMP B-TREE" in line for line in lines), lines
    migrate.downgrade(empty_url, "0018")
    indexes, executions_down, logs_down = _state(empty_url)
    assert (executions_down, logs_down) == (executions, logs)
    assert indexes == before_indexes
    migrate.upgrade(empty_url, "0019")
    assert _state(empty_url) == (upgraded, executions, logs)


def _read_with_plan(url: str, sql: str, params: dict[str, str]) -> tuple[list[str], list[str]]:
    """The first column of ``sql``'s rows, and on SQLite its EXPLAIN QUERY PLAN lines."""

    def read(conn: sa.Connection) -> tuple[list[str], list[str]]:
        values = [str(r[0]) for r in conn.execute(sa.text(sql), params).all()]
        lines: list[str] = []
        if url.startswith("sqlite"):
            rows = conn.execute(sa.text("EXPLAIN QUERY PLAN " + sql), params).all()
            lines = [str(r[-1]) for r in rows]
        return values, lines

    return _in_sync(url, read)


OWNER_NEW = {
    "ix_executions_owner_tenant_id",
    "ix_executions_owner_tenant_status_id",
    "ix_executions_tenantless_owner_id",
    "ix_executions_tenantless_owner_status_id",
}
OWNER_OLD = {"ix_executions_owner_id", "ix_executions_owner_status_id"}


def test_owner_indexes_keyed_by_tenant_over_existing_rows(empty_url: str) -> None:
    """Migration 0020: a user owner's indexes become keyed by the tenant recorded, built over
    the rows that are there; the loner's executions of one tenant read in id order from one
    range; down to 0019 and up again, nothing else changed."""
    migrate.upgrade(empty_url, "0019")
    _fill(empty_url)
    before, executions, logs = _state(empty_url)
    assert before["executions"] >= OWNER_OLD and not OWNER_NEW & before["executions"]
    migrate.upgrade(empty_url, "0020")
    upgraded, executions_after, logs_after = _state(empty_url)
    assert (executions_after, logs_after) == (executions, logs)
    assert upgraded["executions"] >= OWNER_NEW and not OWNER_OLD & upgraded["executions"]
    assert upgraded["executions"] - OWNER_NEW == before["executions"] - OWNER_OLD

    ids, lines = _read_with_plan(
        empty_url,
        "SELECT id FROM executions WHERE owner_user = :u AND tenant = :t ORDER BY id DESC LIMIT 3",
        {"u": LONER, "t": T2},
    )
    assert ids == [f"{i:024x}" for i in (28, 25, 22)]
    if lines:
        assert any("ix_executions_owner_tenant_id" in line for line in lines), lines
        assert not any("TEMP B-TREE" in line for line in lines), lines
    migrate.downgrade(empty_url, "0019")
    assert _state(empty_url) == (before, executions, logs)
    migrate.upgrade(empty_url, "0020")
    assert _state(empty_url) == (upgraded, executions, logs)


def test_log_errors_index_over_existing_rows(empty_url: str) -> None:
    """Migration 0021: showErrors' index holds the error entries only, built over the rows
    that are there, and a tenant's errors are read from it in id order; down and up again."""
    migrate.upgrade(empty_url, "0020")
    _fill(empty_url)

    def add_errors(conn: sa.Connection) -> None:
        conn.execute(
            sa.text("UPDATE logs SET level = 'error' WHERE execution_id IN (:a, :b)"),
            {"a": f"{3:024x}", "b": f"{9:024x}"},
        )
        conn.commit()

    _in_sync(empty_url, add_errors)
    before, executions, logs = _state(empty_url)
    assert "ix_logs_tenant_level_id" in before["logs"]
    migrate.upgrade(empty_url, "0021")
    upgraded, executions_after, logs_after = _state(empty_url)
    assert (executions_after, logs_after) == (executions, logs)
    assert upgraded["logs"] == before["logs"] - {"ix_logs_tenant_level_id"} | {"ix_logs_tenant_errors_id"}

    found, lines = _read_with_plan(
        empty_url,
        "SELECT execution_id FROM logs WHERE tenant = :t AND level = 'error' ORDER BY id DESC LIMIT 5",
        {"t": T1},
    )
    assert found == [f"{9:024x}", f"{3:024x}"]
    if lines:
        assert any("ix_logs_tenant_errors_id" in line for line in lines), lines
        assert not any("TEMP B-TREE" in line for line in lines), lines
    migrate.downgrade(empty_url, "0020")
    assert _state(empty_url) == (before, executions, logs)
    migrate.upgrade(empty_url, "0021")
    assert _state(empty_url) == (upgraded, executions, logs)
