"""Migration 0011 turns each execution's execution_steps rows into one JSON document on the
execution row, in the shape GET /executions/{id} served from the rows (ordered by position,
times as ISO 8601 UTC with milliseconds); its downgrade puts the rows back."""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa

from flowyard.db import migrate
from tests.migrations.test_migrations import _in_sync, empty_url

__all__ = ["empty_url"]

E1, E2, E3 = "e" * 23 + "1", "e" * 23 + "2", "e" * 23 + "3"
T = "2026-01-02 03:04:05"
STEPS = [
    # execution, node, component, function, status, runs, in, out, ms, started, finished, error, output, pos
    (E1, "out", "log", None, "succeeded", 2, 2, 0, 0.25, T + ".678901", T + ".9", None, None, 2),
    (E1, "in", "webhook", None, "succeeded", 1, 1, 1, 0.01, T + ".001", T + ".002", None, {"a": [1, "é"]}, 0),
    (E1, "mid", "script", "main", "failed", 1, 1, 0, 12.5, T + ".1", T + ".2", "boom", None, 1),
    (E2, "in", None, None, "succeeded", 1, 0, 1, 0.0, "2025-12-31 23:59:59.9996", "2026-01-01 00:00:00", None,
     [1, 2], 0),
]  # fmt: skip
EXPECTED_E1 = [
    {"nodeId": "in", "componentId": "webhook", "function": None, "status": "succeeded", "runs": 1,
     "messagesIn": 1, "messagesOut": 1, "durationMs": 0.01, "startedAt": "2026-01-02T03:04:05.001Z",
     "finishedAt": "2026-01-02T03:04:05.002Z", "error": None, "output": {"a": [1, "é"]}},
    {"nodeId": "mid", "componentId": "script", "function": "main", "status": "failed", "runs": 1,
     "messagesIn": 1, "messagesOut": 0, "durationMs": 12.5, "startedAt": "2026-01-02T03:04:05.100Z",
     "finishedAt": "2026-01-02T03:04:05.200Z", "error": "boom", "output": None},
    {"nodeId": "out", "componentId": "log", "function": None, "status": "succeeded", "runs": 2,
     "messagesIn": 2, "messagesOut": 0, "durationMs": 0.25, "startedAt": "2026-01-02T03:04:05.678Z",
     "finishedAt": "2026-01-02T03:04:05.900Z", "error": None, "output": None},
]  # fmt: skip
STEP_COLUMNS = (
    "execution_id, node_id, component_id, function, status, runs, messages_in, messages_out, duration_ms,"
    " started_at, finished_at, error, output, position"
)

CASTS = {"started_at": "timestamptz", "finished_at": "timestamptz", "output": "json"}


def _time(text: str, sqlite: bool) -> str:
    return text if sqlite else text + "+00"


def test_step_rows_become_one_document_and_come_back(empty_url: str) -> None:
    migrate.upgrade(empty_url, "0010")
    sqlite = empty_url.startswith("sqlite")

    def insert(conn: sa.Connection) -> None:
        created = ":t" if sqlite else "CAST(CAST(:t AS text) AS timestamptz)"
        for eid in (E1, E2, E3):
            conn.execute(
                sa.text(
                    "INSERT INTO executions"
                    " (id, flow_id, flow_version, trigger, status, created_at, attempts)"
                    f" VALUES (:id, :f, 1, 'webhook', 'succeeded', {created}, 1)"
                ),
                {"id": eid, "f": "f" * 24, "t": _time(T, sqlite)},
            )
        for row in STEPS:
            values = dict(zip([c.strip() for c in STEP_COLUMNS.split(",")], row, strict=True))
            values["started_at"] = _time(values["started_at"], sqlite)
            values["finished_at"] = _time(values["finished_at"], sqlite)
            values["output"] = None if values["output"] is None else orjson.dumps(values["output"]).decode()
            names = ", ".join(
                f":{k}" if sqlite or k not in CASTS else f"CAST(CAST(:{k} AS text) AS {CASTS[k]})"
                for k in values
            )
            conn.execute(sa.text(f"INSERT INTO execution_steps ({STEP_COLUMNS}) VALUES ({names})"), values)
        conn.commit()

    def documents(conn: sa.Connection) -> dict[str, Any]:
        rows = conn.execute(sa.text("SELECT id, steps FROM executions ORDER BY id")).all()
        return {eid: orjson.loads(doc) if isinstance(doc, str) else doc for eid, doc in rows}

    def step_rows(conn: sa.Connection) -> list[tuple[Any, ...]]:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT execution_id, node_id, status, runs, position, error FROM execution_steps"
                    " ORDER BY execution_id, position"
                )
            ).all()
        ]

    _in_sync(empty_url, insert)
    before = _in_sync(empty_url, step_rows)
    migrate.upgrade(empty_url, "0011")
    docs = _in_sync(empty_url, documents)
    assert docs[E1] == EXPECTED_E1
    assert docs[E2] == [
        {"nodeId": "in", "componentId": None, "function": None, "status": "succeeded", "runs": 1,
         "messagesIn": 0, "messagesOut": 1, "durationMs": 0.0, "startedAt": "2025-12-31T23:59:59.999Z",
         "finishedAt": "2026-01-01T00:00:00.000Z", "error": None, "output": [1, 2]},
    ]  # fmt: skip
    assert docs[E3] is None  # no steps (yet): the API answers []
    tables = _in_sync(empty_url, lambda conn: set(sa.inspect(conn).get_table_names()))
    assert "execution_steps" not in tables

    migrate.downgrade(empty_url, "0010")
    assert _in_sync(empty_url, step_rows) == before
    migrate.upgrade(empty_url, "0011")
    assert _in_sync(empty_url, documents)[E1] == EXPECTED_E1
