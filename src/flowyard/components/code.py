"""The ``code`` component: a JavaScript ``main(data, ctx)`` run in a QuickJS runtime
(the ``quickjs-ng`` binding; the choice and its figures: docs/code-step.md).

Where JavaScript runs: only in a runner process, each execution of a step in a runtime of its
own, made for it and freed after it (nothing an execution leaves in its globals, prototypes or
heap reaches the next one, or another tenant's). The API process never loads the engine: the
check on save (``check_source``) runs in a throwaway child process.

What crosses: the message data goes in as JSON text and is parsed inside; what ``main``
returns comes out as JSON text (``JSON.stringify``) and is parsed here. No host object, no
Python callable is ever put into a runtime, and the runtime is made without QuickJS's
``std``/``os`` modules: no file system, network, timers, process, ``require`` or module
loading (docs/security.md "The code step").

Caps per step: ``FLOWYARD_CODE_MEMORY_MB`` (QuickJS's allocator limit of the runtime) and
``FLOWYARD_CODE_CPU_SECONDS`` (QuickJS's interrupt handler, against the CPU clock, shared by
the step's three calls into the runtime); the call stack is capped at 1 MiB. A step over one
fails alone with an error naming the setting.
"""

from __future__ import annotations

import functools
import hashlib
import re
import subprocess
import sys
import time
from typing import Any

import orjson
from pydantic import Field, ValidationInfo, field_validator

from flowyard.components.builtins import ComponentError, _Fields
from flowyard.components.context import StepContext
from flowyard.components.registry import Component, Message

MAX_SOURCE_CHARS = 65_536
MAX_LOG_ENTRIES = 1000
STACK_BYTES = 1024 * 1024
_CHECK_SECONDS = 0.05  # the API waits for the check: top-level code gets this much of it
_CHECK_MEMORY = 64 * 1024 * 1024
LEVELS = ("debug", "info", "warn", "error")

# Run before the source in each fresh runtime: what a transform has no business with goes
# (a high-resolution clock and shared memory are timing side channels; the job queue is never
# run, so queueMicrotask and promises would silently do nothing).
PRELUDE = (
    "for (const name of ['performance', 'SharedArrayBuffer', 'Atomics', 'queueMicrotask', "
    "'WeakRef', 'FinalizationRegistry']) delete globalThis[name];"
)

# Appended to the source on a line of its own (so the source keeps its line numbers). It holds
# the log entries in a closure, calls main once and hands back one JSON text.
DRIVER = (
    ";globalThis.__flowyard_run = (function () {"
    "const S = JSON.stringify, P = JSON.parse, L = [], LV = " + orjson.dumps(list(LEVELS)).decode() + ";"
    "globalThis.__flowyard_logs = function () { return S(L); };"
    "return function (input) {"
    "const i = P(input);"
    "const ctx = Object.freeze({executionId: i.executionId, flowId: i.flowId, nodeId: i.nodeId,"
    " log(level, message) {"
    f" if (L.length < {MAX_LOG_ENTRIES}) L.push([LV.includes(level) ? level : 'info',"
    " String(message).slice(0, 10000)]); }});"
    "if (typeof main !== 'function') throw new TypeError('the source must define function main(data, ctx)');"
    "const r = main(i.data, ctx);"
    "if (r instanceof Promise) throw new TypeError("
    "'main returned a Promise: a code step is synchronous (no async, await or timers)');"
    "return S({r: r === undefined ? null : r, l: L});"
    "}; })();"
)

_FRAME = re.compile(r"<input>:(\d+):(\d+)")


def _position(text: str, lines: int) -> str:
    """``line 3, column 9`` of the first stack frame in the author's source, or ''."""
    for line_no, col in _FRAME.findall(text):
        if 0 < int(line_no) <= lines:
            return f"line {line_no}, column {col}"
    return ""


def describe(exc: BaseException, source: str) -> str:
    """A JavaScript exception as a step error: its first line and where in the source."""
    text = str(exc)
    head = text.splitlines()[0] if text else type(exc).__name__
    where = _position(text, source.count("\n") + 1)
    return f"{head} ({where})" if where else head


def _limits_error(head: str, memory_mb: int, cpu_seconds: float) -> str | None:
    if head.startswith("InternalError: interrupted"):
        return f"exceeded the {cpu_seconds:g} s CPU limit of a code step (FLOWYARD_CODE_CPU_SECONDS)"
    if head.startswith("InternalError: out of memory"):
        return f"exceeded the {memory_mb} MiB memory limit of a code step (FLOWYARD_CODE_MEMORY_MB)"
    return None


class _Clock:
    """The step's one CPU budget, spent across its calls into the runtime."""

    def __init__(self, seconds: float) -> None:
        self.end = time.thread_time() + seconds

    def left(self) -> float:
        return max(self.end - time.thread_time(), 0.001)


def execute(
    source: str,
    data: Any,
    *,
    memory_mb: int,
    cpu_seconds: float,
    info: dict[str, Any] | None = None,
    max_result_chars: int | None = None,
) -> tuple[list[Any], list[tuple[str, str]], str | None]:
    """Run ``main`` once in a fresh runtime: (values it returned, log entries, error or None).

    ``values`` is empty for ``undefined``/``null``, each non-null element of an array, or the
    one value. Never raises for what the JavaScript does."""
    import _quickjs  # only a runner (or the check's child process) loads the engine

    payload = orjson.dumps({**(info or {}), "data": data}).decode()
    rt = _quickjs.Context()
    rt.set_memory_limit(memory_mb * 1024 * 1024)
    rt.set_max_stack_size(STACK_BYTES)
    clock = _Clock(cpu_seconds)
    logs: list[tuple[str, str]] = []
    try:
        rt.set_time_limit(clock.left())
        rt.eval(PRELUDE)
        rt.set_time_limit(clock.left())
        rt.eval(source + "\n" + DRIVER)
        run = rt.get("__flowyard_run")
        rt.set_time_limit(clock.left())
        raw = run(payload)
        if not isinstance(raw, str):
            return [], logs, "the step's result could not be read (was JSON.stringify replaced?)"
        if max_result_chars is not None and len(raw) > max_result_chars:
            # Refused before it is parsed into Python objects (several times its size).
            return (
                [],
                _logs_after_failure(rt),
                (
                    f"main returned more than the {max_result_chars} byte limit of JSON "
                    "(FLOWYARD_MAX_OUTPUT_BYTES)"
                ),
            )
        out = orjson.loads(raw)
        logs = [(str(level), str(msg)) for level, msg in out["l"]]
        value = out["r"]
    except Exception as exc:
        error = describe(exc, source)
        if error == "null":
            # QuickJS throws null when even the "out of memory" error cannot be allocated, and by
            # the time it reaches here the heap has been freed: the two cannot be told apart.
            error = (
                f"exceeded the {memory_mb} MiB memory limit of a code step (FLOWYARD_CODE_MEMORY_MB), "
                "or main threw null"
            )
        logs = _logs_after_failure(rt)
        return [], logs, _limits_error(error, memory_mb, cpu_seconds) or error
    finally:
        del rt
    if value is None:
        return [], logs, None
    if isinstance(value, list):
        return [v for v in value if v is not None], logs, None
    return [value], logs, None


def _logs_after_failure(rt: Any) -> list[tuple[str, str]]:
    """The entries ``ctx.log`` wrote before main failed (none when the runtime cannot say)."""
    try:
        rt.set_time_limit(0.05)
        fetch = rt.get("__flowyard_logs")
        raw = fetch() if fetch is not None and not isinstance(fetch, str | int | float | bool) else None
        if isinstance(raw, str):
            return [(str(a), str(b)) for a, b in orjson.loads(raw)][:MAX_LOG_ENTRIES]
    except Exception:
        pass
    return []


# The check on save runs in a child process: the API process never runs JavaScript. The
# child evaluates the source in a runtime with the step's sandbox (top-level code, if any,
# runs there under the caps), then asks that ``main`` is a function.
_CHECKER = f"""
import resource, sys, json
resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
import _quickjs
source = sys.stdin.read()
rt = _quickjs.Context()
rt.set_memory_limit({_CHECK_MEMORY})
rt.set_max_stack_size({STACK_BYTES})
out = None
try:
    rt.set_time_limit({_CHECK_SECONDS})
    rt.eval({PRELUDE!r})
    rt.set_time_limit({_CHECK_SECONDS})
    try:
        rt.eval(source)
    except Exception as exc:
        text = str(exc)
        # Interrupted or out of memory: the source compiled (it was running). Its top-level
        # code is not for the check to finish; the runs will meet their own caps.
        if not text.startswith(("InternalError: interrupted", "InternalError: out of memory", "null")):
            raise
    rt.set_time_limit({_CHECK_SECONDS})
    try:
        kind = rt.eval("typeof main")
    except Exception:  # main declared with let/const and not reached: cannot tell
        kind = "function"
    if kind != "function":
        out = "must define function main(data, ctx)"
except Exception as exc:
    out = "!" + str(exc)
sys.stdout.write(json.dumps(out))
"""


@functools.lru_cache(maxsize=256)
def _check_cached(digest: str, source: str) -> str | None:
    del digest  # the cache key's readable half; the source itself keys it too
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHECKER],
            input=source.encode(),
            capture_output=True,
            timeout=15,
            check=False,
        )
        found = orjson.loads(done.stdout) if done.returncode == 0 else "?"
    except (subprocess.TimeoutExpired, orjson.JSONDecodeError, OSError):
        found = "?"
    if found is None:
        return None
    if found == "?":
        return "could not be checked (its check did not finish)"
    if not found.startswith("!"):
        return str(found)
    error = found[1:]
    head = error.splitlines()[0] if error else "error"
    where = _position(error, source.count("\n") + 1)
    if head.startswith("SyntaxError"):
        return f"does not compile: {head}" + (f" ({where})" if where else "")
    return f"its top-level code fails: {head}" + (f" ({where})" if where else "")


def check_source(source: str) -> str | None:
    """Why this source cannot be saved (syntax error with line and column, no ``main``), or
    None. Results are kept for the last 256 sources."""
    return _check_cached(hashlib.sha256(source.encode()).hexdigest(), source)


class CodeFields(_Fields):
    source: str = Field(
        max_length=MAX_SOURCE_CHARS,
        description="JavaScript (ES2023) defining function main(data, ctx). It returns the new data "
        "(one message), an array (one message per non-null element) or undefined/null (no message); "
        "ctx.log(level, message) writes a log entry. Values cross as JSON only.",
    )

    @field_validator("source")
    @classmethod
    def _compiles(cls, value: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("saving"):
            why = check_source(value)
            if why is not None:
                raise ValueError(why)
        return value


async def run_code(message: Message, ctx: StepContext) -> list[Message]:
    settings = ctx.settings
    values, logs, error = execute(
        ctx.fields.source,
        message["data"],
        memory_mb=settings.code_memory_mb,
        cpu_seconds=settings.code_cpu_seconds,
        info={"executionId": ctx.execution_id, "flowId": ctx.flow_id, "nodeId": ctx.node_id},
        max_result_chars=settings.max_output_bytes,
    )
    for level, text in logs:
        ctx.log(level, text)
    if error is not None:
        raise ComponentError(error)
    budget = settings.max_messages
    if len(values) > budget:
        raise ComponentError(f"main returned {len(values)} messages; the limit per execution is {budget}")
    meta = message["metadata"]
    return [{"data": value, "metadata": meta} for value in values]


CODE = Component.single(
    "code",
    "Run JavaScript: main(data, ctx) returns the new data, an array of them (one message each) "
    "or nothing. Sandboxed: no file system, network, timers or modules (docs/components.md).",
    "run",
    run_code,
    CodeFields,
    awaits=False,
)
