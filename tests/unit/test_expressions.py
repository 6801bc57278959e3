"""JSONata expressions: compiled once per thread and text, usable from the thread that made them."""

from __future__ import annotations

import threading

import pytest

from flowyard.components.expressions import ExpressionError, apply_mapper, compile_expression, compile_mapper


def test_compiled_once_per_thread() -> None:
    first = compile_expression("a + 1")
    assert compile_expression("a + 1") is first
    results: dict[str, object] = {}

    def other_thread() -> None:
        expr = compile_expression("a + 1")
        results["same"] = expr is first
        results["value"] = expr.evaluate({"a": 2})

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert results == {"same": False, "value": 3}
    assert first.evaluate({"a": 41}) == 42


def test_errors_are_expression_errors() -> None:
    with pytest.raises(ExpressionError, match="invalid JSONata"):
        compile_expression("foo(")
    with pytest.raises(ExpressionError, match="failed"):
        compile_expression("$number('x')").evaluate({})


def test_mapper_drops_undefined_leaves_and_keeps_constants() -> None:
    mapper = compile_mapper({"id": "order.id", "missing": "nope", "n": 3, "deep": {"x": "order.x"}})
    assert apply_mapper(mapper, {"order": {"id": "A", "x": [1]}}) == {"id": "A", "n": 3, "deep": {"x": [1]}}
