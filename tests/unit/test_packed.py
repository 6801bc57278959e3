"""The packed steps column (``db/packed.py``): what is written reads back as written, through
a real SQLite file; cells written before packing still read; a broken cell fails alone."""

from __future__ import annotations

import sqlite3
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from flowyard.db import packed
from flowyard.jsonvalue import UNREADABLE
from flowyard.queue import steps
from flowyard.queue.records import StepRecord

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_any_json_value_reads_back_as_written(value: Any) -> None:
    cell = packed.pack(value)
    assert cell[0] in (packed.RAW, packed.DEFLATED_V1)
    assert packed.unpack(cell) == value
    assert packed.unpack_checked(cell) == value


def _document(n: int) -> list[dict[str, Any]]:
    t = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    return steps.document(
        [
            StepRecord(
                node_id=f"step-{i}",
                component_id="jsonata",
                function=None,
                status="succeeded",
                runs=1,
                messages_in=1,
                messages_out=1,
                duration_ms=0.4,
                started_at=t + timedelta(milliseconds=i),
                finished_at=t + timedelta(milliseconds=i + 1),
                error=None,
                output={"orderId": i, "email": "x@y.z"},
                position=i,
                attempts=1,
                attempt_errors=[],
            )
            for i in range(n)
        ]
    )


def test_a_steps_document_is_deflated_to_a_fraction_of_its_text() -> None:
    doc = _document(3)
    text = len(packed.orjson.dumps(doc))
    cell = packed.pack(doc)
    assert cell[0] == packed.DEFLATED_V1
    assert len(cell) * 4 < text, (len(cell), text)
    assert packed.unpack(cell) == doc


def test_small_values_are_kept_raw() -> None:
    assert packed.pack([]) == b"\x00[]"
    assert packed.unpack(b"\x00[]") == []


def test_the_column_on_a_real_sqlite_file(tmp_path: Path) -> None:
    """Written as a BLOB in the TEXT column; a cell written as JSON text (before packing) and a
    NULL read as they were; a broken cell reads as UNREADABLE, its neighbours as written."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'p.db'}")
    table = sa.Table(
        "t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", packed.PackedJson)
    )
    table.metadata.create_all(engine)
    doc = _document(4)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 1, "v": doc}, {"id": 2, "v": None}, {"id": 3, "v": {"k": 1}}])
        conn.execute(sa.text("INSERT INTO t (id, v) VALUES (4, :v)"), {"v": '[{"old": "text"}]'})
        conn.execute(sa.text("INSERT INTO t (id, v) VALUES (5, :v)"), {"v": b"\x01\x00garbage"})
        conn.execute(sa.text("INSERT INTO t (id, v) VALUES (6, :v)"), {"v": b"\x09{}"})
    raw = sqlite3.connect(tmp_path / "p.db")
    declared = raw.execute("SELECT type FROM pragma_table_info('t') WHERE name = 'v'").fetchone()[0]
    kinds = dict(raw.execute("SELECT id, typeof(v) FROM t").fetchall())
    raw.close()
    assert declared == "TEXT", "no table rebuild: the column keeps its declared type"
    assert kinds == {1: "blob", 2: "null", 3: "blob", 4: "text", 5: "blob", 6: "blob"}
    with engine.connect() as conn:
        got = dict(conn.execute(sa.select(table.c.id, table.c.v).order_by(table.c.id)).all())  # type: ignore[arg-type]
        raws = dict(conn.execute(sa.select(table.c.id, packed.raw_cell(table.c.v, sqlite=True))).all())  # type: ignore[arg-type]
    assert got == {1: doc, 2: None, 3: {"k": 1}, 4: [{"old": "text"}], 5: UNREADABLE, 6: UNREADABLE}
    assert packed.unpack_or_none(raws[1]) == doc and packed.unpack_or_none(raws[4]) == [{"old": "text"}]
    assert packed.unpack_or_none(raws[5]) is None and packed.unpack_or_none(raws[6]) is None
    with pytest.raises(zlib.error):
        packed.unpack_checked(raws[5])
    with pytest.raises(ValueError, match="unknown version byte 9"):
        packed.unpack_checked(raws[6])
    engine.dispose()


def test_a_truncated_stream_is_refused_not_read_short() -> None:
    cell = packed.pack(_document(3))
    with pytest.raises(ValueError, match="truncated"):
        packed.unpack_checked(cell[: len(cell) // 2])
    assert packed.unpack(cell[: len(cell) // 2]) == UNREADABLE
