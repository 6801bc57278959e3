"""JSONata expressions: compiled once per flow version, evaluated per message.

The library is jsonatapy (a Rust implementation with Python bindings): on the
expressions of bench/jsonata_compare.py it gives the same results as the
pure-Python port jsonata-python at 50-60x the speed (docs/engine.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import jsonatapy


class ExpressionError(Exception):
    pass


class Expression:
    __slots__ = ("_compiled", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self._compiled = jsonatapy.compile(text)
        except Exception as exc:  # ValueError with the JSONata error code, sometimes others
            raise ExpressionError(f"invalid JSONata {text!r}: {exc}") from None

    def evaluate(self, data: Any) -> Any:
        try:
            return self._compiled.evaluate(data)
        except RecursionError:
            raise ExpressionError(f"JSONata {self.text!r} recursed too deeply") from None
        except Exception as exc:
            raise ExpressionError(f"JSONata {self.text!r} failed: {exc}") from None


# jsonatapy's compiled expressions belong to the thread that made them (they may not
# be used or dropped on another), so the cache is per thread. The service compiles and
# evaluates on its event loop's thread; tools that run the app in other threads
# (test clients) get their own entries.
_local = threading.local()
_CACHE_SIZE = 4096


def compile_expression(text: str) -> Expression:
    """Compile (and cache) an expression; raises ExpressionError if it does not parse."""
    cache: OrderedDict[str, Expression] | None = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = OrderedDict()
    found = cache.get(text)
    if found is not None:
        cache.move_to_end(text)
        return found
    expr = Expression(text)
    cache[text] = expr
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return expr


def compile_mapper(mapper: Any, path: str = "mapper") -> Any:
    """A mapper object whose leaves are JSONata strings, compiled leaf by leaf."""
    if isinstance(mapper, str):
        return compile_expression(mapper)
    if isinstance(mapper, dict):
        return {k: compile_mapper(v, f"{path}.{k}") for k, v in mapper.items()}
    if isinstance(mapper, list):
        return [compile_mapper(v, f"{path}[{i}]") for i, v in enumerate(mapper)]
    return mapper  # numbers, booleans and null are constants


def apply_mapper(compiled: Any, data: Any) -> Any:
    if isinstance(compiled, Expression):
        return compiled.evaluate(data)
    if isinstance(compiled, dict):
        out = {}
        for key, value in compiled.items():
            result = apply_mapper(value, data)
            if result is not None:  # JSONata "undefined" drops the key, as in the reference
                out[key] = result
        return out
    if isinstance(compiled, list):
        return [apply_mapper(v, data) for v in compiled]
    return compiled
