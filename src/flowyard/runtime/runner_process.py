"""A runner process: the only place flow code runs (``python -m flowyard.runtime.runner_process``).

The engine (``flowyard.runtime.pool``) starts several with fork+exec, sends
them compiled-flow specs and executions over stdin, and reads outcomes from the
process's original stdout. A runner never opens the database and gets no
secrets but the decrypted credentials of the flows it runs. It runs many
executions at once on one asyncio loop, so steps that await (http, delay)
overlap; at most one execution is on the CPU at a time, and the runner
publishes which one in the shared slot (see ``flowyard.runtime.ipc``) each time
the loop resumes it. The engine's watchdog reads that slot to enforce the CPU,
memory and wall-time limits by killing the runner from outside.

Inside, the runner caps its own data segment (``RLIMIT_DATA``) so a single huge
allocation fails here instead of exhausting the host, writes no core files, runs
at a lower priority than the API, and dies with its parent.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Generator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

# Optional packages that libraries pick up when they happen to be installed (httpcore imports
# trio; httpx imports its command line's click, rich and pygments) and that a runner never uses:
# marked absent before anything imports them, so a runner starts in less CPU. Every start
# counts: a memory bomb costs a runner start, at the runners' priority. (With the test tools
# installed: 0.36 s of CPU per start before, see docs/security.md "The victim numbers".)
if __name__ == "__main__":  # a runner process, not a module imported elsewhere (tests)
    for _unused in ("trio", "click", "rich", "pygments"):
        sys.modules.setdefault(_unused, None)  # type: ignore[arg-type]

import orjson

from flowyard import isolate
from flowyard.runtime.ipc import (
    FRAME,
    VERDICT_CPU,
    VERDICT_MEMORY,
    Slot,
    claimed_from_wire,
    frame_each,
    outcome_to_wire,
    read_frame,
)
from flowyard.runtime.runner import CompiledFlow, FlowNotRunnable, error_outcome, run_execution

if TYPE_CHECKING:
    import httpx

    from flowyard.components.registry import Registry
    from flowyard.config import Settings
    from flowyard.queue.records import Claimed

_PR_SET_PDEATHSIG = 1


def http_client(settings: Settings) -> httpx.AsyncClient:
    """The HTTP client components get as ``ctx.http`` (one per runner process), under the
    outbound network policy."""
    from flowyard.components.netpolicy import build_client

    return build_client(settings)


class _Job:
    __slots__ = ("claimed", "cpu_left_ns", "key", "node", "seq")

    def __init__(self, seq: int, key: str, claimed: Claimed, cpu_budget_ns: int) -> None:
        self.seq = seq
        self.key = key
        self.claimed = claimed
        self.cpu_left_ns = cpu_budget_ns
        self.node = 0


class _Tracked(Coroutine[Any, Any, None]):
    """Wraps an execution's coroutine: every time the loop resumes it, the slot says so.

    CPU time is charged to the execution per resume (the main thread's CPU clock),
    so an execution that burns its budget across many awaits is caught as well as
    one that never returns.
    """

    __slots__ = ("_coro", "_job", "_slot")

    def __init__(self, coro: Coroutine[Any, Any, None], job: _Job, slot: Slot) -> None:
        self._coro = coro
        self._job = job
        self._slot = slot

    def _resume(self, fn: Any, *args: Any) -> Any:
        job = self._job
        start = time.thread_time_ns()
        self._slot.enter(job.seq, start + job.cpu_left_ns, job.node)
        try:
            return fn(*args)
        finally:
            self._slot.leave()
            job.cpu_left_ns -= time.thread_time_ns() - start
            if job.cpu_left_ns <= 0:
                _die(self._slot, job, VERDICT_CPU)

    def send(self, value: Any) -> Any:
        return self._resume(self._coro.send, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._resume(self._coro.throw, typ)
        return self._resume(self._coro.throw, typ, val, tb)  # pragma: no cover - legacy signature

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:  # pragma: no cover - only a Task drives it
        return (yield from self._coro.__await__())


def _die(slot: Slot, job: _Job, verdict: int) -> None:
    """Leave the verdict for the engine, then go: nothing else may run on this process."""
    slot.verdict(job.seq, job.node, verdict)
    os.kill(os.getpid(), signal.SIGKILL)


class RunnerProcess:
    def __init__(self, settings: Settings, registry: Registry, slot: Slot, out_fd: int) -> None:
        self.settings = settings
        self.registry = registry
        self.slot = slot
        self.out_fd = out_fd
        self.flows: dict[str, CompiledFlow | FlowNotRunnable] = {}
        self.indexes: dict[str, dict[str, int]] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.outbox: list[Any] = []
        self.cpu_budget_ns = int(settings.execution_cpu_seconds * 1e9)
        self.http: httpx.AsyncClient | None = None
        self._transport: asyncio.WriteTransport | None = None

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**20)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
        )
        self._transport, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(self.out_fd, "wb", buffering=0)
        )
        self.http = http_client(self.settings)
        self.send(["ready", os.getpid()])
        while True:
            try:
                messages = await read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the engine closed our stdin: stop
            for message in messages:
                try:
                    self.handle(message)
                except Exception as exc:
                    # One message this runner cannot take fails alone (isolate.py).
                    self.refuse(message, exc)

    def send(self, message: Any) -> None:
        """Queue a message for the next frame. Each is encoded on its own when the frame is
        made (``ipc.frame_each``), so one that JSON cannot hold (an integer beyond 64 bits, a
        key that is not a string) fails its own execution, not the frame it would have shared."""
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append(message)

    def _flush(self) -> None:
        batch, self.outbox = self.outbox, []
        if batch and self._transport is not None:
            self._transport.write(frame_each(batch, _unsendable))

    def refuse(self, message: Any, exc: BaseException) -> None:
        why = isolate.reason(exc)
        seq = message[1] if isinstance(message, list) and len(message) > 1 and message[0] == "run" else None
        if isinstance(seq, int):
            self.send(["refused", seq, why])
        else:
            print(f"flowyard runner: a message could not be handled: {why}", file=sys.stderr, flush=True)

    def handle(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "run":
            _, seq, key, wire = message
            job = _Job(seq, key, claimed_from_wire(wire), self.cpu_budget_ns)
            task = asyncio.get_running_loop().create_task(_Tracked(self._run(job), job, self.slot))
            self.tasks[seq] = task
        elif kind == "flow":
            _, key, spec = message
            compiled: CompiledFlow | FlowNotRunnable
            try:
                compiled = CompiledFlow.compile(
                    flow_id=spec["id"],
                    version=spec["version"],
                    tenant=spec["tenant"],
                    owner_user=spec["owner"],
                    graph=spec["graph"],
                    registry=self.registry,
                )
                compiled.credentials = spec["credentials"]
                self.indexes[key] = {nid: i + 1 for i, nid in enumerate(compiled.nodes)}
            except FlowNotRunnable as exc:
                compiled = exc
            except Exception as exc:
                compiled = FlowNotRunnable(f"{type(exc).__name__}: {exc}")
            self.flows[key] = compiled
        elif kind == "drop":
            self.flows.pop(message[1], None)
            self.indexes.pop(message[1], None)
        elif kind == "cancel":
            running = self.tasks.get(message[1])
            if running is not None:
                running.cancel()

    async def _run(self, job: _Job) -> None:
        try:
            flow = self.flows.get(job.key)
            if isinstance(flow, CompiledFlow):
                index = self.indexes[job.key]
                slot = self.slot

                def on_step(node_id: str) -> None:
                    job.node = index.get(node_id, 0)
                    slot.step(job.node)

                assert self.http is not None
                outcome = await run_execution(
                    flow,
                    job.claimed,
                    settings=self.settings,
                    http=self.http,
                    credentials=flow.credentials,
                    deadline=time.monotonic() + self.settings.execution_wall_seconds,
                    on_step=on_step,
                )
            else:
                reason = str(flow) if flow is not None else "the runner does not know this flow"
                outcome = error_outcome(
                    job.claimed, status="failed", error=reason, log_message=f"execution not run: {reason}"
                )
            self.send(["done", job.seq, outcome_to_wire(outcome)])
        except MemoryError:
            _die(self.slot, job, VERDICT_MEMORY)
        except Exception as exc:  # a bug, not a flow's failure: still answer for the execution
            why = f"the runner could not run it: {type(exc).__name__}: {exc}"
            failed = error_outcome(job.claimed, status="failed", error=why, log_message=why)
            self.send(["done", job.seq, outcome_to_wire(failed)])
        finally:
            self.tasks.pop(job.seq, None)


def _unsendable(message: Any, exc: BaseException) -> Any:
    """An outcome that cannot be encoded: its execution fails alone, the frame still goes."""
    if isinstance(message, list) and len(message) == 3 and message[0] == "done":
        why = f"its outcome could not be sent from its runner: {isolate.reason(exc)}"
        print(f"flowyard runner: execution #{message[1]}: {why}", file=sys.stderr, flush=True)
        now = datetime.now(UTC).isoformat()
        return ["done", message[1], ["failed", None, why, now, [], [[now, "error", why, None, None, None]]]]
    print(f"flowyard runner: a message could not be sent: {isolate.reason(exc)}", file=sys.stderr, flush=True)
    return None


def _read_exactly(fd: int, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = os.read(fd, size - len(out))
        if not chunk:
            raise SystemExit(0)
        out += chunk
    return out


def _vm(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: stdin EOF still stops us
        pass
    if os.getppid() == 1:  # the parent died before we asked
        os._exit(0)


def main() -> None:
    slot_fd = int(sys.argv[1])
    # The protocol owns the original stdout; anything a component prints goes to stderr.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    # The engine decides when we stop (and kills us); a terminal's Ctrl-C is for it, not us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    (size,) = FRAME.unpack(_read_exactly(0, FRAME.size))
    config = orjson.loads(_read_exactly(0, size))
    # Absolute: the engine set it already at start-up (so that our imports run niced too).
    os.setpriority(os.PRIO_PROCESS, 0, int(config["nice"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    threading.stack_size(512 * 1024)  # resolver threads count against the data limit

    import uvloop

    from flowyard.components import builtins
    from flowyard.components.registry import Registry
    from flowyard.config import Settings

    settings = Settings(**config["settings"])
    registry = Registry.load(builtins.ALL)
    # Backstop behind the engine's RSS watchdog: a single allocation that would take the
    # data segment past start-up size + the memory limit fails here, at once.
    cap = _vm("VmData:") + settings.runner_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    buf = mmap.mmap(slot_fd, 0)
    os.close(slot_fd)
    from flowyard import heap

    heap.settle()  # before any flow runs: what a flow makes is collected as usual
    uvloop.run(RunnerProcess(settings, registry, Slot(buf), out_fd).serve())
    os._exit(0)


if __name__ == "__main__":
    main()
