"""The ``code`` component (SPEC §12): a JavaScript ``main(data, ctx)`` in a fresh QuickJS
runtime per run. Here the runtime is driven directly (``code.execute``) and through the API's
validation on save; tests/engine/test_code_containment.py runs it in real runner processes."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from flowyard.components import code
from flowyard.components.code import MAX_SOURCE_CHARS, check_source, execute
from tests.conftest import Account, flow_body

CAPS = {"memory_mb": 32, "cpu_seconds": 0.5}


def run(source: str, data: Any = None) -> tuple[list[Any], list[tuple[str, str]], str | None]:
    return execute(source, data, **CAPS)  # type: ignore[arg-type]


def ok(source: str, data: Any = None) -> list[Any]:
    values, _logs, error = run(source, data)
    assert error is None, error
    return values


# -- what main returns ---------------------------------------------------------------------


def test_a_transform_with_imperative_logic() -> None:
    source = """
function main(data, ctx) {
  let total = 0;
  const seen = new Map();
  for (const item of data.items) {
    total += item.price * item.qty;
    seen.set(item.sku, (seen.get(item.sku) || 0) + item.qty);
  }
  const m = /^(\\w+)-(\\d+)$/.exec(data.id) ?? [null, "none", "0"];
  return {prefix: m[1], number: Number(m[2]), total, qty: Object.fromEntries(seen),
          nested: data.rows.flatMap(r => r.cells.map(c => c * 2))};
}"""
    data = {
        "id": "A-17",
        "items": [
            {"sku": "p", "price": 2.5, "qty": 2},
            {"sku": "q", "price": 1, "qty": 3},
            {"sku": "p", "price": 1, "qty": 1},
        ],
        "rows": [{"cells": [1, 2]}, {"cells": [3]}],
    }
    assert ok(source, data) == [
        {"prefix": "A", "number": 17, "total": 9.0, "qty": {"p": 3, "q": 3}, "nested": [2, 4, 6]}
    ]


def test_es2023_features() -> None:
    source = (
        "function main(d) { return [[[3,1,2].toSorted(), [1,2,3].findLast(x => x < 3), "
        "d?.a?.b ?? 'none', 2n ** 3n === 8n]] }"
    )
    assert ok(source, {}) == [[[1, 2, 3], 2, "none", True]]


def test_an_array_is_one_message_per_element_and_nothing_is_no_message() -> None:
    assert ok("function main(d) { return d.map(x => ({n: x})) }", [1, 2, 3]) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert ok("function main(d) { return [1, null, 2] }") == [1, 2]  # null elements are skipped
    assert ok("function main(d) { return [[1, 2]] }") == [[1, 2]]  # one message whose data is an array
    assert ok("function main(d) { }") == []
    assert ok("function main(d) { return undefined }") == []
    assert ok("function main(d) { return null }") == []
    assert ok("function main(d) { return [] }") == []
    assert ok("function main(d) { return 0 }") == [0]
    assert ok("function main(d) { return '' }") == [""]
    assert ok("function main(d) { return false }") == [False]


def test_values_cross_as_json_only() -> None:
    # A Date becomes its ISO string, a function or undefined property disappears, a Map is {}.
    assert ok("function main(d) { return {t: new Date(0), f() {}, u: undefined, m: new Map([[1,2]])} }") == [
        {"t": "1970-01-01T00:00:00.000Z", "m": {}}
    ]
    _, _, error = run("function main(d) { return 10n }")
    assert error is not None and "BigInt" in error
    _, _, error = run("function main(d) { const a = {}; a.self = a; return a }")
    assert error is not None and error.startswith("TypeError") and "circular" in error.lower()


def test_data_goes_in_as_json() -> None:
    assert ok(
        "function main(d) { return [[typeof d, Array.isArray(d.a), d.s]] }", {"a": [1], "s": "é\u2028"}
    ) == [["object", True, "é\u2028"]]
    assert ok("function main(d) { return d === null }", None) == [True]


def test_ctx_log_and_ctx_ids() -> None:
    values, logs, error = execute(
        "function main(d, ctx) { ctx.log('warn', 'careful'); ctx.log('nonsense', {a: 1}); "
        "ctx.log('debug'); return [ctx.executionId, ctx.nodeId, Object.isFrozen(ctx)] }",
        1,
        info={"executionId": "e1", "flowId": "f1", "nodeId": "calc"},
        **CAPS,  # type: ignore[arg-type]
    )
    assert error is None
    assert values == ["e1", "calc", True]
    assert logs == [("warn", "careful"), ("info", "[object Object]"), ("debug", "undefined")]


def test_log_entries_are_kept_when_main_fails_and_are_bounded() -> None:
    _, logs, error = run("function main(d, ctx) { ctx.log('info', 'before'); throw new Error('after') }")
    assert logs == [("info", "before")]
    assert error == "Error: after (line 1, column 62)"
    _, logs, error = run("function main(d, ctx) { for (let i = 0; i < 5000; i++) ctx.log('info', 'x' + i) }")
    assert error is None
    assert len(logs) == code.MAX_LOG_ENTRIES and logs[-1] == ("info", f"x{code.MAX_LOG_ENTRIES - 1}")
    _, logs, error = run("function main(d, ctx) { ctx.log('info', 'y'.repeat(50000)) }")
    assert error is None and logs == [("info", "y" * 10000)]


# -- errors with positions -----------------------------------------------------------------


def test_exceptions_name_line_and_column_in_the_source() -> None:
    source = "function helper(x) {\n  return x.missing.deeper;\n}\nfunction main(d) {\n  return helper(d);\n}"
    _, _, error = run(source, {})
    assert error == "TypeError: cannot read property 'deeper' of undefined (line 2, column 10)"
    _, _, error = run("function main(d) {\n\n    throw new RangeError('out of range: ' + d);\n}", 7)
    assert error == "RangeError: out of range: 7 (line 3, column 45)"
    _, _, error = run("function main(d) { throw 'a string' }")
    assert error == "a string"
    _, _, error = run("const x = 1;")
    assert error is not None and "must define function main" in error


def test_a_syntax_error_at_run_time_names_its_position() -> None:
    # A stored flow whose source no longer compiles (saved before a check) fails its step.
    _, _, error = run("function main(d) {\n  return d +;\n}")
    assert error is not None and error.startswith("SyntaxError") and "(line 2, column" in error


def test_check_source_on_save() -> None:
    assert check_source("function main(data, ctx) { return data }") is None
    why = check_source("function main(d) {\n  let x = ;\n}")
    assert (
        why is not None and why.startswith("does not compile: SyntaxError") and "(line 2, column 11)" in why
    )
    assert check_source("function mian(d) {}") == "must define function main(data, ctx)"
    assert check_source("import os from 'os';\nfunction main() {}") is not None  # a script, not a module
    # Top-level code that outlasts the check's short CPU budget compiled: it is not refused here
    # (each run meets its own caps), and its main is still looked for.
    assert check_source("while (true) {}\nfunction main() {}") is None
    assert check_source("while (true) {}\nfunction other() {}") == "must define function main(data, ctx)"
    assert check_source("const a = []; for (;;) a.push('x'.repeat(4096));\nfunction main() {}") is None
    assert check_source("while (true) {}\nconst main = () => 1;") is None  # cannot tell: let it be
    why = check_source("undefinedThing();\nfunction main() {}")
    assert why == "its top-level code fails: ReferenceError: undefinedThing is not defined (line 1, column 1)"


def test_the_check_on_save_never_loads_the_engine_into_the_calling_process() -> None:
    script = (
        "import sys\nfrom flowyard.components.code import check_source\n"
        "assert check_source('function main(d) { return d }') is None\n"
        "assert check_source('function main(d) { return d +') is not None\n"
        "assert '_quickjs' not in sys.modules, 'the API process loaded the JavaScript engine'\n"
        "print('clean')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "clean", done.stderr


# -- caps: each fails the step alone -------------------------------------------------------


def test_an_endless_loop_hits_the_cpu_cap() -> None:
    _, _, error = run("function main() { for (;;) {} }")
    assert error == "exceeded the 0.5 s CPU limit of a code step (FLOWYARD_CODE_CPU_SECONDS)"


def test_top_level_code_is_under_the_cpu_cap_too() -> None:
    _, _, error = run("for (;;) {}\nfunction main() { return 1 }")
    assert error == "exceeded the 0.5 s CPU limit of a code step (FLOWYARD_CODE_CPU_SECONDS)"


def test_a_memory_hog_hits_the_memory_cap() -> None:
    _, _, error = run("function main() { const a = []; for (;;) a.push('x'.repeat(1000) + a.length) }")
    assert error is not None
    assert error.startswith("exceeded the 32 MiB memory limit of a code step (FLOWYARD_CODE_MEMORY_MB)")
    _, _, error = run("function main() { const a = []; for (;;) a.push({n: a.length}) }")
    assert error is not None and "32 MiB memory limit" in error


def test_deep_recursion_is_a_range_error_with_its_position() -> None:
    _, _, error = run("function main(d) {\n  return main(d) + 1;\n}")
    assert error == "RangeError: Maximum call stack size exceeded (line 2, column 15)"


def test_a_huge_string_fails() -> None:
    _, _, error = run("function main() { let s = 'x'; for (;;) s = s + s; }")
    assert error is not None
    assert error.startswith("InternalError: string too long") or "memory limit" in error


def test_a_result_over_the_output_cap_is_refused_before_it_is_parsed() -> None:
    values, logs, error = execute(
        "function main(d, ctx) { ctx.log('info', 'big'); return 'x'.repeat(2000) }",
        None,
        max_result_chars=1000,
        **CAPS,  # type: ignore[arg-type]
    )
    assert values == [] and logs == [("info", "big")]
    assert error == "main returned more than the 1000 byte limit of JSON (FLOWYARD_MAX_OUTPUT_BYTES)"


def test_a_huge_result_fails_in_the_runtime_not_the_host() -> None:
    _, _, error = run("function main() { return 'x'.repeat(20 * 1024 * 1024) }")
    assert error is not None and "memory limit" in error


# -- the sandbox ---------------------------------------------------------------------------

HOST_NAMES = [
    "require", "process", "fetch", "setTimeout", "setInterval", "setImmediate", "clearTimeout",
    "std", "os", "print", "console", "scriptArgs", "XMLHttpRequest", "WebSocket", "Deno", "Bun",
    "module", "exports", "__dirname", "performance", "SharedArrayBuffer", "Atomics", "queueMicrotask",
    "WeakRef", "FinalizationRegistry", "WebAssembly", "importScripts", "navigator",
]  # fmt: skip


def test_no_host_object_is_reachable() -> None:
    names = ",".join(f"'{n}'" for n in HOST_NAMES)
    source = f"function main() {{ return [[{names}].filter(n => typeof globalThis[n] !== 'undefined')] }}"
    assert ok(source) == [[]]
    # Through eval and the Function constructor (the "host code" routes), the same global object.
    assert ok(
        "function main() { return [[eval('typeof std'), new Function('return typeof os')(), "
        "eval('this') === globalThis]] }"
    ) == [["undefined", "undefined", True]]
    # Whatever is on the global object is a standard built-in, plus main and the driver.
    standard = set(ok("function main() { return [Object.getOwnPropertyNames(globalThis)] }")[0])
    assert standard - {"main", "__flowyard_run", "__flowyard_logs"} <= {
        "Object", "Function", "Error", "EvalError", "RangeError", "ReferenceError", "SyntaxError",
        "TypeError", "URIError", "InternalError", "AggregateError", "SuppressedError", "Iterator",
        "Array", "parseInt", "parseFloat", "isNaN", "isFinite", "decodeURI", "decodeURIComponent",
        "encodeURI", "encodeURIComponent", "escape", "unescape", "Infinity", "NaN", "undefined",
        "eval", "Number", "Boolean", "String", "Math", "Reflect", "Symbol", "DisposableStack",
        "AsyncDisposableStack", "globalThis", "BigInt", "Date", "RegExp", "JSON", "Proxy", "Map",
        "Set", "WeakMap", "WeakSet", "ArrayBuffer", "Uint8ClampedArray", "Int8Array", "Uint8Array",
        "Int16Array", "Uint16Array", "Int32Array", "Uint32Array", "BigInt64Array", "BigUint64Array",
        "Float16Array", "Float32Array", "Float64Array", "DataView", "Promise", "DOMException",
        "btoa", "atob",
    }  # fmt: skip


def test_dynamic_import_and_static_import_fail() -> None:
    _, _, error = run("function main() { return import('os') }")
    assert (
        error == "TypeError: main returned a Promise: a code step is synchronous (no async, await or timers)"
    )
    _, _, error = run("import * as os from 'os';\nfunction main() { return 1 }")
    assert error is not None and error.startswith("SyntaxError")
    # A promise's callbacks never run: there is no event loop in the runtime.
    assert ok(
        "function main() { let ran = false; Promise.resolve().then(() => { ran = true }); return ran }"
    ) == [False]


def test_no_state_survives_from_one_run_to_the_next() -> None:
    polluter = """
globalThis.counter = (globalThis.counter || 0) + 1;
function main(d) {
  Object.prototype.polluted = 'yes';
  Array.prototype.push = function () { return 'hijacked' };
  JSON.stringify = () => '"hijacked"';
  globalThis.secret = d.secret;
  return counter;
}"""
    assert ok(polluter, {"secret": "tenant-a"}) == [1]  # the driver kept the real JSON.stringify
    victim = """
function main() {
  const a = []; a.push(1);
  return {polluted: ({}).polluted ?? null, secret: typeof secret, counter: typeof counter,
          push: a.length, json: JSON.stringify({ok: 1})};
}"""
    assert ok(victim) == [
        {"polluted": None, "secret": "undefined", "counter": "undefined", "push": 1, "json": '{"ok":1}'}
    ]
    # The same source twice: its top-level state starts again each run.
    assert ok("globalThis.n = (globalThis.n || 0) + 1; function main() { return n }") == [1]
    assert ok("globalThis.n = (globalThis.n || 0) + 1; function main() { return n }") == [1]


# -- through the API -----------------------------------------------------------------------


def code_flow(source: Any, **node: Any) -> dict[str, Any]:
    fields = {} if source is None else {"source": source}
    return flow_body(
        graph={
            "nodes": [
                {"id": "in", "componentId": "webhook"},
                {"id": "calc", "componentId": "code", "fields": fields, **node},
            ],
            "edges": [{"source": "in", "target": "calc"}],
        }
    )


async def test_save_validates_the_source(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.post("/flows", json=code_flow("function main(d) { return d }"), headers=admin.headers)
    assert r.status_code == 201, r.text
    for source, expected in [
        (None, "Field required"),
        (42, "valid string"),
        ("x" * (MAX_SOURCE_CHARS + 1), f"at most {MAX_SOURCE_CHARS} characters"),
        ("function main(d) {\n  return d +\n}", "does not compile: SyntaxError"),
        ("function other() {}", "must define function main(data, ctx)"),
    ]:
        r = await client.post("/flows", json=code_flow(source), headers=admin.headers)
        assert r.status_code == 400, (source, r.text)
        errors = r.json()["errors"]
        assert len(errors) == 1, errors
        assert errors[0]["field"] == "graph.nodes[1].fields.source", errors
        assert expected in errors[0]["message"] and "(node 'calc')" in errors[0]["message"], errors
    r = await client.post(
        "/flows", json=code_flow("function main(d) {\n  return d +\n}"), headers=admin.headers
    )
    assert "(line 3, column 1)" in r.json()["errors"][0]["message"]
    r = await client.post(
        "/flows", json=code_flow("function main() {}", function="nope"), headers=admin.headers
    )
    assert r.status_code == 400


async def test_components_lists_code_with_its_fields(client: httpx.AsyncClient, admin: Account) -> None:
    r = await client.get("/components", headers=admin.headers)
    assert r.status_code == 200
    found = {c["id"]: c for c in r.json()["data"]}["code"]
    assert found["fields"]["required"] == ["source"]
    assert found["fields"]["properties"]["source"]["maxLength"] == MAX_SOURCE_CHARS
    assert found["fields"]["additionalProperties"] is False


@pytest.mark.parametrize("extra", [{"source": "function main() {}", "timeout": 3}])
def test_unknown_fields_are_refused(extra: dict[str, Any]) -> None:
    assert code.CODE.validate_fields(extra) == [(".timeout", "Extra inputs are not permitted")]
