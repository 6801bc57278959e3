"""flowyard.jsonvalue: the one depth limit and the store's reader."""

from __future__ import annotations

import orjson
import pytest

from flowyard import jsonvalue
from flowyard.jsonvalue import MAX_DEPTH, TooDeep, check_depth, depth_exceeds, loads, loads_stored


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), (None, 0), ("[[[", 0), ([], 1), ({}, 1), ([[1]], 2), ({"a": [{"b": {}}]}, 4), ((1, (2,)), 2)],
)
def test_depth_counts_containers(value: object, depth: int) -> None:
    assert not depth_exceeds(value, depth)
    assert depth_exceeds(value, depth - 1) == (depth > 0)


def test_a_wide_and_a_deep_branch() -> None:
    deep: list[object] = []
    for _ in range(MAX_DEPTH - 2):
        deep = [deep]
    value = {"wide": list(range(1000)), "deep": deep}  # MAX_DEPTH levels in all
    assert not depth_exceeds(value)
    value["deeper"] = [deep]
    assert depth_exceeds(value)
    with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH} levels"):
        check_depth(value)


def test_loads_at_and_past_the_limit() -> None:
    assert loads(nested(MAX_DEPTH)) == orjson.loads(nested(MAX_DEPTH))
    for depth in (MAX_DEPTH + 1, 254, 255, 1024, 1025, 100_000):
        with pytest.raises(TooDeep):
            loads(nested(depth))
    # Brackets inside strings are not nesting: counted by the pre-check, found shallow by the walk.
    text = b'["' + b"[{" * 500 + b'"]'
    assert loads(text) == ["[{" * 500]
    with pytest.raises(orjson.JSONDecodeError):
        loads(b"[1,")
    with pytest.raises(orjson.JSONDecodeError):
        loads(b'"\\ud800"')  # a lone surrogate escape is not a string Python can store as UTF-8


def test_loads_stored_is_total_for_numbers_sqlite_kept() -> None:
    assert loads_stored(42) == 42
    assert loads_stored(0.5) == 0.5
    assert loads_stored("42") == 42
    assert loads_stored('{"a": null}') == {"a": None}
    # Text that is not JSON, or deeper than orjson reads: the marker, never an exception that
    # would fail the other rows of the statement.
    assert loads_stored("Inf") == jsonvalue.UNREADABLE
    assert loads_stored("[" * 1100 + "]" * 1100) == jsonvalue.UNREADABLE
    assert loads_stored("{") is not loads_stored("{"), "a copy each time"
    assert jsonvalue.dumps_stored({"a": [1, "\x00"]}) == '{"a":[1,"\\u0000"]}'


def test_broker_payloads_deeper_than_the_limit_become_their_text() -> None:
    from flowyard.components.connectors.amqp import decode_body
    from flowyard.components.connectors.redis import decode_entry

    assert decode_body(nested(MAX_DEPTH)) == orjson.loads(nested(MAX_DEPTH))
    assert decode_body(nested(MAX_DEPTH + 1)) == nested(MAX_DEPTH + 1).decode()
    assert decode_body(nested(2000)) == nested(2000).decode()
    assert decode_body(b"42") == 42
    assert decode_entry({b"a": b"[1]", b"b": nested(300), "c": b"x"}) == {
        "a": [1],
        "b": nested(300).decode(),
        "c": "x",
    }
