"""The queue's indexes hold its live rows only (migration 0024, issue 19 storage): the fair
claim's statements read the partial indexes of the queued and of the running rows, on both
databases, and a finished execution is in neither of them, nor in the sub-flow callers' index."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from flowyard.db.compact import id_cell
from flowyard.db.prepared import SQLiteForm
from flowyard.db.session import Database
from flowyard.queue import store as queue
from flowyard.queue.models import QUEUED_ROWS, RUNNING_ROWS, Execution
from tests.engine.test_fair_claim import seed
from tests.engine.test_heartbeat import _outcome

QUEUED_INDEX, RUNNING_INDEX = "ix_executions_queued_group_id", "ix_executions_running_group_id"

# Each statement of the claim that reads the queue's groups, with values for its parameters.
STATEMENTS: list[tuple[str, Any, dict[str, Any]]] = [
    ("groups with queued work", queue._QUEUED_GROUPS, {}),
    ("a group's oldest queued", queue._PICK, {"grp": "t:a", "n": 5}),
    ("a group's next queued", queue._PICK_MORE, {"grp": "t:a", "n": 5, "taken": ["0" * 24]}),
    *(
        (f"running counts {key}", prepared, {"groups": ["t:a", "t:b"], "finished": ["0" * 24]})
        for key, prepared in queue._RUNNING_COUNTS.items()
    ),
]


async def _indexes_read(db: Database, prepared: Any, params: dict[str, Any]) -> set[str]:
    """The indexes the plan of ``prepared`` reads, with its values bound as the claim binds
    them (SQLite: the ``?`` form the cursor runs; PostgreSQL: a prepared statement's generic
    plan, which a literal in the SQL serves and a bound status would not)."""
    dialect = "sqlite" if db.is_sqlite else "postgresql"
    statement = prepared.statement(dialect)
    async with db.engine.connect() as conn:
        if db.is_sqlite:
            form = SQLiteForm(statement, db.engine.dialect, None)
            args = form.args({k: v for k, v in params.items() if k in form.names})
            assert args is not None
            rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + args[0], tuple(args[1]))).all()
            return {word for row in rows for word in str(row[-1]).split() if word.startswith("ix_")}
        compiled = statement.compile(dialect=db.engine.dialect)
        state = compiled.construct_expanded_state({k: v for k, v in params.items() if k in compiled.params})
        values = [state.parameters[name] for name in state.positiontup or []]
        literals = ", ".join(
            str(v) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'" for v in values
        )
        await conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        # A small table is read whole: make that prohibitively expensive, as a backlog does.
        for setting in ("enable_seqscan", "enable_bitmapscan"):
            await conn.exec_driver_sql(f"SET LOCAL {setting} = off")
        await conn.exec_driver_sql("PREPARE claim_statement AS " + state.statement)
        execute = "EXECUTE claim_statement" + (f"({literals})" if values else "")
        raw = (await conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + execute)).scalar()
        await conn.exec_driver_sql("DEALLOCATE claim_statement")
    plan = json.loads(raw) if isinstance(raw, str) else raw
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.add(node["Index Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


@pytest.mark.parametrize(("what", "prepared", "params"), STATEMENTS, ids=[s[0] for s in STATEMENTS])
async def test_the_fair_claim_reads_the_indexes_of_the_live_rows(
    db: Database, what: str, prepared: Any, params: dict[str, Any]
) -> None:
    await seed(db, 50, tenant="a")
    await seed(db, 50, tenant="b")
    async with db.write() as session:
        await queue.claim(session, worker_id="w", limit=10, lease_seconds=60, cap=0)
    wanted = RUNNING_INDEX if what.startswith("running") else QUEUED_INDEX
    read = await _indexes_read(db, prepared, params)
    assert wanted in read, (what, read)
    # Not the full status index: the planner took the partial one, not a walk of every row
    # of the status.
    assert "ix_executions_status_id" not in read, (what, read)


async def _in_index(db: Database, index: str, eid: str) -> bool:
    """Whether ``eid`` is among the rows of ``index``. SQLite: read through that index
    (``INDEXED BY``), so a row outside a partial index's predicate is not found; PostgreSQL: the
    rows that match the index's predicate."""
    where = {
        QUEUED_INDEX: QUEUED_ROWS,
        RUNNING_INDEX: RUNNING_ROWS,
        "ix_executions_parent": "parent_execution_id IS NOT NULL",
    }[index]
    async with db.engine.connect() as conn:
        if db.is_sqlite:
            row = await conn.exec_driver_sql(
                f"SELECT count(*) FROM executions INDEXED BY {index} WHERE {where} AND id = ?",
                (id_cell(eid),),  # stored as 12 bytes (flowyard.db.compact)
            )
        else:
            row = await conn.exec_driver_sql(
                f"SELECT count(*) FROM executions WHERE {where} AND id = $1", (eid,)
            )
        return bool(row.scalar())


async def test_a_finished_execution_leaves_the_queues_indexes(db: Database) -> None:
    (eid,) = await seed(db, 1, tenant="a")
    assert await _in_index(db, QUEUED_INDEX, eid)
    assert not await _in_index(db, RUNNING_INDEX, eid)
    async with db.write() as session:
        claimed = await queue.claim(session, worker_id="w", limit=1, lease_seconds=60, cap=0)
    assert [c.id for c in claimed] == [eid]
    (c,) = claimed
    assert not await _in_index(db, QUEUED_INDEX, eid)
    assert await _in_index(db, RUNNING_INDEX, eid)
    async with db.write() as session:
        await queue.complete(session, [_outcome(c)], worker_id="w")
    assert not await _in_index(db, QUEUED_INDEX, eid)
    assert not await _in_index(db, RUNNING_INDEX, eid)
    assert not await _in_index(db, "ix_executions_parent", eid)
    async with db.read() as session:
        status = await session.scalar(sa.select(Execution.status).where(Execution.id == eid))
    assert status == "succeeded"
