"""The graph runner: compiles a flow version once, then runs executions of it.

Semantics (docs/engine.md): nodes without incoming edges receive the trigger
message; a node's function returns zero, one or many messages; each is offered
to every outgoing edge, which passes it when its ``condition`` is truthy and
hands the target the ``mapper``'s result (or the data unchanged). A node with
several incoming edges runs once per arriving message, but a ``join`` (SPEC §12), which holds
what arrives until its set is complete (runtime/join.py) and then runs once on the set. Messages
are processed breadth-first, one at a time, so a run is deterministic.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from flowyard.clock import isoformat, utcnow
from flowyard.components.builtins import ComponentError, truthy
from flowyard.components.context import Reply, StepContext
from flowyard.components.expressions import (
    Expression,
    ExpressionError,
    apply_mapper,
    compile_expression,
    compile_mapper,
)
from flowyard.components.registry import Component, ComponentFunction, Message, Registry
from flowyard.components.retry import CallFlow, Park, RetryPolicy
from flowyard.jsonvalue import TooBig, TooDeep, depth_exceeds, size_over
from flowyard.queue import continuation
from flowyard.queue import steps as step_docs
from flowyard.queue.records import Claimed, Outcome, StepRecord
from flowyard.runtime.join import JoinSet

if TYPE_CHECKING:
    import httpx

    from flowyard.config import Settings

_OUTPUT_SAMPLE = 3
_OUTPUT_BYTES = 64 * 1024


class FlowNotRunnable(Exception):
    """The flow cannot run here (a component is missing, its graph is broken)."""


@dataclass
class CompiledNode:
    id: str
    component: Component | None
    function: str | None
    fn: ComponentFunction | None
    fields: Any
    credentials_id: str | None
    awaits: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass
class CompiledEdge:
    id: str
    source: str
    target: str
    condition: Expression | None
    mapper: Any
    on_failure: bool = False
    slot: int = 0  # its position among the edges into its target (a join's edge order)


@dataclass
class CompiledFlow:
    flow_id: str
    version: int
    tenant: str | None
    owner_user: str | None
    nodes: dict[str, CompiledNode]
    out_edges: dict[str, list[CompiledEdge]]  # the success edges ("on": "success", the default)
    roots: list[str]
    failure_edges: dict[str, list[CompiledEdge]] = field(default_factory=dict)  # "on": "failure"
    credentials: dict[str, dict[str, Any]] = field(default_factory=dict)
    loaded_at: float = field(default_factory=time.monotonic)
    incoming: dict[str, int] = field(default_factory=dict)  # how many edges go into each node

    @property
    def credential_ids(self) -> list[str]:
        return sorted({n.credentials_id for n in self.nodes.values() if n.credentials_id})

    @classmethod
    def compile(
        cls,
        *,
        flow_id: str,
        version: int,
        tenant: str | None,
        owner_user: str | None,
        graph: dict[str, Any],
        registry: Registry,
    ) -> CompiledFlow:
        nodes: dict[str, CompiledNode] = {}
        for raw in graph.get("nodes", []):
            cid = raw.get("componentId")
            component = registry.get(cid) if cid else None
            if cid and component is None:
                raise FlowNotRunnable(f"node {raw['id']}: component {cid!r} is not installed")
            fn = None
            function = raw.get("function")
            fields: Any = raw.get("fields") or {}
            if component is not None:
                function = function or component.default_function
                fn = component.functions.get(function)
                if fn is None:
                    raise FlowNotRunnable(f"node {raw['id']}: component {cid!r} has no function {function!r}")
                try:
                    fields = component.parse_fields(fields)
                except Exception as exc:
                    raise FlowNotRunnable(f"node {raw['id']}: invalid fields: {exc}") from None
            nodes[raw["id"]] = CompiledNode(
                raw["id"],
                component,
                function,
                fn,
                fields,
                raw.get("credentials_id"),
                awaits=component.awaits if component is not None else False,
                retry=RetryPolicy.of(raw.get("retry")),
            )
        out_edges: dict[str, list[CompiledEdge]] = {n: [] for n in nodes}
        failure_edges: dict[str, list[CompiledEdge]] = {n: [] for n in nodes}
        targets = set()
        into: dict[str, int] = {}  # edges into each node so far
        for i, raw in enumerate(graph.get("edges", [])):
            src, dst = raw.get("source"), raw.get("target")
            if src not in nodes or dst not in nodes:
                raise FlowNotRunnable(f"edge {raw.get('id') or i}: unknown node")
            config = raw.get("config") or {}
            try:
                cond = compile_expression(config["condition"]) if config.get("condition") else None
                mapper = compile_mapper(config["mapper"]) if config.get("mapper") is not None else None
            except ExpressionError as exc:
                raise FlowNotRunnable(f"edge {raw.get('id') or i}: {exc}") from None
            on_failure = raw.get("on") == "failure"
            slot = into.get(dst, 0)
            into[dst] = slot + 1
            edge = CompiledEdge(raw.get("id") or f"{src}->{dst}", src, dst, cond, mapper, on_failure, slot)
            (failure_edges if on_failure else out_edges)[src].append(edge)
            targets.add(dst)
        roots = [n for n in nodes if n not in targets]
        if not roots:
            raise FlowNotRunnable("the graph has no node without incoming edges")
        for n in roots:
            root = nodes[n].component
            if root is not None and root.joins:  # refused on save; a stored flow may predate that
                raise FlowNotRunnable(f"node {n}: a join needs incoming edges")
        return cls(
            flow_id,
            version,
            tenant,
            owner_user,
            nodes,
            out_edges,
            roots,
            failure_edges=failure_edges,
            incoming=into,
        )

    def join_set(self, node_id: str) -> JoinSet:
        node = self.nodes[node_id]
        return JoinSet(
            edges=self.incoming.get(node_id, 0),
            count=getattr(node.fields, "count", None),
            timeout=float(getattr(node.fields, "timeout", 60.0)),
        )


@dataclass
class _Stats:
    position: int
    runs: int = 0
    messages_in: int = 0
    messages_out: int = 0
    duration: float = 0.0
    started_at: Any = None
    finished_at: Any = None
    error: str | None = None
    outputs: list[Any] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)
    attempts: int = 0
    attempt_errors: list[dict[str, Any]] = field(default_factory=list)
    failed: bool = False  # failed after its last attempt (perhaps on into a failure edge)
    summarised: bool = False  # carried over and not run again: no new summary log entry
    failed_on: Any = None  # the message the step failed on (a retry starts from it)

    def took(self, message: Any) -> None:
        """A message the step runs on: kept in its input sample (one the outcome can carry)."""
        if len(self.inputs) < _OUTPUT_SAMPLE and not depth_exceeds(message):
            self.inputs.append(message["data"])

    @classmethod
    def of_record(cls, r: StepRecord) -> _Stats:
        """A step carried over by a continuation, to go on counting from."""
        return cls(
            position=r.position,
            runs=r.runs,
            messages_in=r.messages_in,
            messages_out=r.messages_out,
            duration=r.duration_ms / 1000,
            started_at=r.started_at,
            finished_at=r.finished_at,
            error=r.error,
            outputs=list(r.output) if isinstance(r.output, list) else [],
            inputs=list(r.inputs) if isinstance(r.inputs, list) else [],
            attempts=r.attempts,
            attempt_errors=list(r.attempt_errors),
            failed=r.status == "failed",
            summarised=True,
        )


class _Attempt(Exception):
    """One attempt of a step failed: ``retryable`` says whether another may mend it."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after


class StepFailed(Exception):
    def __init__(self, node_id: str, message: str, *, logged: bool = False) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.message = message
        self.logged = logged  # its error entry is written already

    @property
    def error(self) -> str:
        return f"step {self.node_id} failed: {self.message}"


class LimitExceeded(StepFailed):
    """The execution ran out of one of its limits (wall time here; CPU and memory in the pool)."""

    @property
    def error(self) -> str:
        return f"step {self.node_id} {self.message}"


def limit_message(limit: str, settings: Settings) -> str:
    """``exceeded the 10 s CPU limit``: the one wording of every limit, wherever it is enforced."""
    if limit == "cpu":
        return f"exceeded the {settings.execution_cpu_seconds:g} s CPU limit"
    if limit == "memory":
        return f"exceeded the {settings.runner_memory_mb} MiB memory limit"
    return f"exceeded the {settings.execution_wall_seconds:g} s wall-time limit"


def _as_messages(value: Any, metadata: dict[str, Any]) -> list[Message]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, dict) or "data" not in item:
            raise ComponentError("a component must return messages shaped {data, metadata}")
        meta = item.get("metadata")
        out.append({"data": item["data"], "metadata": meta if isinstance(meta, dict) else metadata})
    return out


def _check_sizes(
    node_id: str, out: list[Message], reply: Reply | None, settings: Settings, *, sink: bool
) -> None:
    """What a step produced against the size caps (SPEC §6): the reply it set and, when it is a
    last step, its output are stored and returned as the result (``max_result_bytes``); every
    message it emits goes through the IPC and on to the next step (``max_output_bytes``)."""
    result_cap, output_cap = settings.max_result_bytes, settings.max_output_bytes
    if reply is not None and (n := size_over(reply.body, result_cap)) is not None:
        too_big = TooBig(n, result_cap, "FLOWYARD_MAX_RESULT_BYTES")
        raise StepFailed(node_id, f"the body of its reply {too_big}")
    for msg in out:
        # Each message is written once here; its data is part of it, so only a message over the
        # result cap can carry data over it (then the data alone is measured).
        n = size_over(msg, min(output_cap, result_cap) if sink else output_cap)
        if n is None:
            continue
        if n > output_cap:
            raise StepFailed(node_id, f"its output {TooBig(n, output_cap, 'FLOWYARD_MAX_OUTPUT_BYTES')}")
        if sink and (n := size_over(msg["data"], result_cap)) is not None:
            too_big = TooBig(n, result_cap, "FLOWYARD_MAX_RESULT_BYTES")
            raise StepFailed(node_id, f"its output, the execution's result, {too_big}")


def _sample(values: list[Any]) -> Any:
    if not values:
        return None
    encoded = orjson.dumps(values)
    if len(encoded) > _OUTPUT_BYTES:
        return {"truncated": True, "bytes": len(encoded)}
    return values


async def run_execution(
    flow: CompiledFlow,
    execution: Claimed,
    *,
    settings: Settings,
    http: httpx.AsyncClient,
    credentials: dict[str, dict[str, Any]] | None = None,
    deadline: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Outcome:
    """Run one execution to its end, or until it parks; never raises for a failing step.

    ``deadline`` (``time.monotonic()``) is the wall-time limit: no step starts
    after it and an awaiting step is cut off at it. ``on_step`` is told each node
    as it starts (the runner process publishes it for the pool's watchdog).
    MemoryError propagates: the runner process treats it as its memory limit.

    Failing well (SPEC §11): a failed attempt that may be mended runs again after the node's
    retry interval; a wait of at most FLOWYARD_DELAY_PARK_SECONDS is slept here, a longer one
    (and a long ``delay``) parks the execution: the outcome is ``waiting`` with ``resume_at``
    and the continuation (every pending message with its attempts, the steps so far) it goes
    on from, on any worker. A step that fails after its last attempt hands a message to its
    failure edges, if any, and the execution goes on.
    """
    metadata = {
        "source": execution.trigger,
        "executionId": execution.id,
        "flowId": execution.flow_id,
        "receivedAt": isoformat(execution.created_at),
    }
    if execution.scheduled_for is not None:
        metadata["scheduledFor"] = isoformat(execution.scheduled_for)
    # A continuation (a resumed or replayed execution) says where to go on from, and which
    # steps' results it carries over; else the trigger message goes to every root.
    carried = [step_docs.record(doc, i) for i, doc in enumerate(continuation.carried_of(execution.state))]
    stats: dict[str, _Stats] = {c.node_id: _Stats.of_record(c) for c in carried if c.node_id in flow.nodes}
    state = execution.state if isinstance(execution.state, dict) else {}
    # How many messages were handed to each node so far: a message's index at its node, part of
    # its idempotency key, so the key is the same when the execution runs again from the same
    # point (a redelivery replays the same deterministic order).
    enqueued: dict[str, int] = {k: int(v) for k, v in (state.get("enqueued") or {}).items()}
    emitted = int(state.get("emitted") or 0)
    last_sink: Any = state.get("lastSink")
    pending: deque[_Pending] = deque()
    # What each join node holds (SPEC §12, runtime/join.py), carried over by a continuation.
    join_nodes = {n for n, c in flow.nodes.items() if c.component is not None and c.component.joins}
    joins: dict[str, JoinSet] = {}
    for nid, doc in (state.get("joins") or {}).items():
        if nid in join_nodes:
            joins[nid] = flow.join_set(nid)
            joins[nid].restore(doc)

    def offer(node: str, message: Message, slot: int | None = None) -> None:
        index = enqueued.get(node, 0)
        enqueued[node] = index + 1
        pending.append(_Pending(node, message, 0, index, False, edge=slot if node in join_nodes else None))

    if execution.state:
        for p in continuation.pending_of(execution.state):
            if p.get("node") in flow.nodes:
                node = p["node"]
                index = p.get("index")
                if index is None:  # a replay's entry: a new arrival at its node
                    index = enqueued.get(node, 0)
                    enqueued[node] = index + 1
                edge = p.get("edge")
                pending.append(
                    _Pending(
                        node,
                        p["message"],
                        int(p.get("attempt") or 0),
                        int(index),
                        bool(p.get("resumed")),
                        edge=int(edge) if isinstance(edge, int) else None,
                        call=p.get("call") if isinstance(p.get("call"), dict) else None,
                        child=p.get("child") if isinstance(p.get("child"), dict) else None,
                    )
                )
    else:
        for root in flow.roots:
            offer(root, {"data": execution.input, "metadata": metadata})
    logs: list[dict[str, Any]] = []
    reply: list[Reply] = []
    if isinstance(state.get("reply"), dict):
        r = state["reply"]
        reply.append(Reply(int(r.get("status", 200)), r.get("body"), dict(r.get("headers") or {})))
    error: StepFailed | None = None
    park_at: datetime | None = None
    base_log = {
        "tenant": flow.tenant,
        "user_id": flow.owner_user,
        "flow_id": flow.flow_id,
        "execution_id": execution.id,
    }
    message: Message = {}

    def expire_join(node_id: str) -> None:
        """A join's open set ran out of time: the step fails, into its failure edges if any."""
        nonlocal message
        node, st = flow.nodes[node_id], stats[node_id]
        text, partial = joins[node_id].expire()
        st.summarised = False
        st.runs += 1
        st.attempts += 1
        st.failed, st.error, st.finished_at = True, text, utcnow()
        logs.append(_log(base_log, "error", f"step {node_id} ({_name(node)}) failed: {text}", node, None))
        taken = _take_failure_edges(flow, node, partial, text, 1)
        if taken is None:
            message = partial
            raise StepFailed(node_id, text, logged=True)
        for edge, msg in taken:
            offer(edge.target, msg, edge.slot)

    try:
        while True:
            if not pending:
                # Nothing left to deliver: a join still holding an incomplete set waits for it,
                # parked (nothing more can come in this run), and fails once its time is over.
                open_sets = {n: j.deadline for n, j in joins.items() if j.deadline is not None}
                if not open_sets:
                    break
                now = utcnow()
                due = [n for n, at in open_sets.items() if at <= now]
                if not due:
                    park_at = min(open_sets.values())
                    break
                for n in due:
                    expire_join(n)
                continue
            item = pending.popleft()
            node_id, message = item.node, item.message
            node = flow.nodes[node_id]
            if on_step is not None:
                on_step(node_id)
            st = stats.get(node_id)
            if st is None:
                st = stats[node_id] = _Stats(position=len(stats), started_at=utcnow())
            st.summarised = False
            if deadline is not None and time.monotonic() >= deadline:
                st.finished_at = st.finished_at or utcnow()
                raise LimitExceeded(node_id, limit_message("wall", settings))
            if item.edge is not None and node_id in join_nodes:
                # An arrival at a join: held until its set is complete, then the set runs.
                js = joins.get(node_id) or joins.setdefault(node_id, flow.join_set(node_id))
                now = utcnow()
                if js.deadline is not None and js.deadline <= now:
                    expire_join(node_id)  # the open set's time ran out before this came
                st.messages_in += 1
                assembled = js.arrive(item.edge, message, now)
                st.finished_at = now
                if assembled is None:
                    continue
                message = assembled
                st.runs += 1
                st.took(message)
            elif item.attempt == 0:  # a new arrival (a parked delay was uncounted when it parked)
                st.runs += 1
                st.messages_in += 1
                st.took(message)
            while True:  # the attempts at this message
                attempt = item.attempt + 1
                started = time.perf_counter()
                attempt_started = utcnow()
                step_logs: list[dict[str, Any]] = []
                replied = reply[-1] if reply else None
                deep_log = False
                timeout = settings.step_timeout
                parked: Park | None = None
                failure: _Attempt | None = None
                out: list[Message] = []
                try:
                    if node.credentials_id and node.credentials_id not in (credentials or {}):
                        raise _Attempt(
                            f"credentials {node.credentials_id} not found "
                            "(or not readable by this flow's tenant)",
                            retryable=False,
                        )
                    if node.fn is None:
                        out = [message]
                    else:
                        ctx = StepContext(
                            execution_id=execution.id,
                            flow_id=flow.flow_id,
                            node_id=node_id,
                            component_id=node.component.id if node.component else None,
                            function=node.function or "",
                            tenant=flow.tenant,
                            owner_user=flow.owner_user,
                            fields=node.fields,
                            credentials=(credentials or {}).get(node.credentials_id)
                            if node.credentials_id
                            else None,
                            settings=settings,
                            http=http,
                            logs=step_logs,
                            reply=reply,
                            attempt=attempt,
                            idempotency_key=f"{execution.id}:{node_id}:{item.index}",
                            resumed=item.resumed,
                            child=item.child,
                        )
                        if node.awaits:
                            timeout = _step_timeout(settings, deadline)
                            async with asyncio.timeout(timeout):
                                out = _as_messages(await node.fn(message, ctx), message["metadata"])
                        else:
                            out = _as_messages(await node.fn(message, ctx), message["metadata"])
                except Park as p:
                    parked = p
                except _Attempt as exc:
                    failure = exc
                except TimeoutError:
                    if timeout < settings.step_timeout:
                        raise LimitExceeded(node_id, limit_message("wall", settings)) from None
                    failure = _Attempt(f"timed out after {settings.step_timeout:g} s", retryable=True)
                except ComponentError as exc:
                    failure = _Attempt(str(exc), retryable=exc.retryable, retry_after=exc.retry_after)
                except ExpressionError as exc:
                    failure = _Attempt(str(exc), retryable=False)
                except (asyncio.CancelledError, MemoryError):
                    raise
                except Exception as exc:
                    failure = _Attempt(f"{type(exc).__name__}: {exc}", retryable=True)
                finally:
                    st.duration += time.perf_counter() - started
                    st.finished_at = utcnow()
                    for entry in step_logs:
                        data = entry.get("data")
                        if depth_exceeds(data):  # the entry is kept without it; the step fails below
                            data, deep_log = None, True
                        elif (big := size_over(data, settings.max_result_bytes)) is not None:
                            data = {"truncated": True, "bytes": big, "limit": settings.max_result_bytes}
                        logs.append(_log(base_log, entry["level"], entry["message"], node, data))
                if parked is not None:
                    # A long wait: the execution parks, this message first when it goes on. A
                    # sub-flow call (SPEC §12) parks until its child finishes, or its timeout.
                    park_at = utcnow() + timedelta(seconds=parked.seconds)
                    if item.attempt == 0:
                        st.runs -= 1  # counted when it goes on
                        st.messages_in -= 1
                    call = None
                    text = f"step {node_id} waits {parked.seconds:g} s: the execution is parked until "
                    if isinstance(parked, CallFlow):
                        call = {"flowId": parked.flow_id, "timeout": parked.seconds}
                        text = (
                            f"step {node_id} runs flow {parked.flow_id}: the execution is parked until "
                            "it ends, at most until "
                        )
                    pending.appendleft(_Pending(node_id, message, item.attempt, item.index, True, call=call))
                    logs.append(
                        _log(
                            base_log,
                            "info",
                            text + isoformat(park_at),
                            node,
                            {"resumeAt": isoformat(park_at)},
                        )
                    )
                    break
                st.attempts += 1
                if failure is None:
                    try:
                        _check_output(
                            node_id, out, reply, replied, deep_log, settings, sink=not flow.out_edges[node_id]
                        )
                    except StepFailed as exc:
                        failure = _Attempt(exc.message, retryable=False)
                if failure is None:
                    break
                st.attempt_errors.append(
                    {"attempt": attempt, "startedAt": isoformat(attempt_started), "error": failure.message}
                )
                policy = node.retry
                if failure.retryable and attempt < policy.max_attempts:
                    wait = policy.interval(attempt, retry_after=failure.retry_after)
                    logs.append(
                        _log(
                            base_log,
                            "warn",
                            f"step {node_id} attempt {attempt} of {policy.max_attempts} failed: "
                            f"{failure.message}; retrying in {wait:.3g} s",
                            node,
                            {"attempt": attempt, "retryIn": round(wait, 3)},
                        )
                    )
                    item = _Pending(node_id, message, attempt, item.index, False)
                    short = wait <= settings.delay_park_seconds
                    if short and (deadline is None or time.monotonic() + wait < deadline):
                        await asyncio.sleep(wait)
                        continue
                    park_at = utcnow() + timedelta(seconds=wait)
                    pending.appendleft(item)
                    break
                # Failed after its last attempt: on into its failure edges, if any. The message it
                # failed on is kept either way, so the step debugger shows it.
                st.failed = True
                st.error = failure.message
                st.failed_on = None if depth_exceeds(message) else message
                detail = f" (attempt {attempt} of {policy.max_attempts})" if policy.max_attempts > 1 else ""
                logs.append(
                    _log(
                        base_log,
                        "error",
                        f"step {node_id} ({_name(node)}) failed{detail}: {failure.message}",
                        node,
                        {"attempt": attempt} if policy.max_attempts > 1 else None,
                    )
                )
                taken = _take_failure_edges(flow, node, message, failure.message, attempt)
                if taken is None:
                    raise StepFailed(node_id, failure.message, logged=True)
                for edge, msg in taken:
                    offer(edge.target, msg, edge.slot)
                out = []
                break
            if park_at is not None:
                break
            st.messages_out += len(out)
            emitted += len(out)
            if emitted > settings.max_messages:
                raise StepFailed(node_id, f"the execution exceeded {settings.max_messages} messages")
            edges = flow.out_edges[node_id]
            for msg in out:
                if len(st.outputs) < _OUTPUT_SAMPLE:
                    st.outputs.append(msg["data"])
                if not edges:
                    last_sink = msg["data"]
                for edge in edges:
                    data = msg["data"]
                    try:
                        if edge.condition is not None and not truthy(edge.condition.evaluate(data)):
                            continue
                        if edge.mapper is not None:
                            data = apply_mapper(edge.mapper, data)
                            if data is None or data == {}:
                                raise StepFailed(node_id, f"mapper of edge {edge.id} yielded nothing")
                    except ExpressionError as exc:
                        raise StepFailed(node_id, f"edge {edge.id}: {exc}") from None
                    offer(edge.target, {"data": data, "metadata": msg["metadata"]}, edge.slot)
    except StepFailed as exc:
        error = exc
        st = stats[exc.node_id]
        st.error = exc.message
        st.failed = True
        # The message being delivered when it failed (a retry starts from it), kept only when it
        # fits the outcome (a message too deep to carry fails the step instead: without its
        # input, a retry starts from the trigger data).
        st.failed_on = None if depth_exceeds(message) else message
        if not exc.logged:
            node = flow.nodes[exc.node_id]
            logs.append(
                _log(
                    base_log, "error", f"step {exc.node_id} ({_name(node)}) failed: {exc.message}", node, None
                )
            )
    finished = utcnow()
    waiting = park_at is not None and error is None
    steps = []
    for node_id, st in stats.items():
        node = flow.nodes[node_id]
        cid = node.component.id if node.component else None
        status = "failed" if st.failed else "succeeded"
        if waiting and (
            (pending and pending[0].node == node_id) or (node_id in joins and joins[node_id].arrivals)
        ):
            status = "waiting"
        steps.append(
            StepRecord(
                node_id=node_id,
                component_id=cid,
                function=node.function,
                status=status,
                runs=st.runs,
                messages_in=st.messages_in,
                messages_out=st.messages_out,
                duration_ms=round(st.duration * 1000, 3),
                started_at=st.started_at,
                finished_at=st.finished_at,
                error=st.error,
                output=_sample(st.outputs),
                position=st.position,
                attempts=st.attempts,
                attempt_errors=st.attempt_errors[-_ATTEMPT_ERRORS:],
                input=st.failed_on,
                inputs=_sample(st.inputs),
            )
        )
        if waiting or st.summarised:
            continue  # summarised when the execution ends
        logs.append(
            _log(
                base_log,
                "info",
                f"step {node_id} ({_name(node)}) ran "
                f"{st.runs} time(s) in {st.duration * 1000:.1f} ms, {st.messages_out} message(s) out"
                + (f", {st.attempts} attempts" if st.attempts > st.runs else ""),
                node,
                {
                    "runs": st.runs,
                    "attempts": st.attempts,
                    "messagesIn": st.messages_in,
                    "messagesOut": st.messages_out,
                    "durationMs": round(st.duration * 1000, 3),
                },
            )
        )
    state_out: Any = None
    if waiting:
        status = "waiting"
        result = None
        state_out = {
            "v": continuation.VERSION,
            "pending": [
                {
                    "node": p.node,
                    "message": p.message,
                    "attempt": p.attempt,
                    "index": p.index,
                    "resumed": p.resumed,
                    **({"edge": p.edge} if p.edge is not None else {}),
                    **({"call": p.call} if p.call is not None else {}),
                }
                for p in pending
            ],
            "joins": {n: j.document() for n, j in joins.items() if j.arrivals},
            "steps": step_docs.document(steps),
            "enqueued": enqueued,
            "emitted": emitted,
            "lastSink": last_sink,
            "reply": {"status": reply[-1].status, "body": reply[-1].body, "headers": reply[-1].headers}
            if reply
            else None,
        }
    elif error is not None:
        status = "failed"
        result = None
    elif reply:
        status = "succeeded"
        r = reply[-1]
        result = {"reply": {"status": r.status, "body": r.body, "headers": r.headers}}
    else:
        status = "succeeded"
        result = {"data": last_sink}
    return Outcome(
        execution_id=execution.id,
        flow_id=flow.flow_id,
        tenant=flow.tenant,
        owner_user=flow.owner_user,
        created_at=execution.created_at,
        status=status,
        result=result,
        error=error.error if error else None,
        finished_at=finished,
        steps=steps,
        logs=logs,
        resume_at=park_at if waiting else None,
        state=state_out,
    )


@dataclass
class _Pending:
    """A message on its way to a node: ``attempt`` attempts were already made at it, ``index``
    is its arrival number at the node (its idempotency key), ``resumed``: the execution parked
    for this node on this message (a long delay) and now goes on."""

    node: str
    message: Message
    attempt: int
    index: int
    resumed: bool
    edge: int | None = None  # at a join: the position of the edge it came by (its edge order)
    call: dict[str, Any] | None = None  # a parked sub-flow call: {"flowId", "timeout"}
    child: dict[str, Any] | None = None  # ... and its child's outcome, written by the queue


# At most this many attempt errors are kept on a step (the last ones); attempts counts all.
_ATTEMPT_ERRORS = 20


def _name(node: CompiledNode) -> str:
    return node.component.id if node.component else "pass-through"


def _check_output(
    node_id: str,
    out: list[Message],
    reply: list[Reply],
    replied: Reply | None,
    deep_log: bool,
    settings: Settings,
    *,
    sink: bool,
) -> None:
    # What a step returns goes to the IPC and the store: never deeper than the limit.
    if deep_log:
        raise StepFailed(node_id, f"the data of a log entry it wrote {TooDeep()}")
    for msg in out:
        if depth_exceeds(msg["data"]) or depth_exceeds(msg["metadata"]):
            raise StepFailed(node_id, f"its output {TooDeep()}")
    if reply and reply[-1] is not replied and depth_exceeds(reply[-1].body):
        raise StepFailed(node_id, f"the body of its reply {TooDeep()}")
    # ... nor larger than the size caps (SPEC §6): a message in flight, and what is stored
    # and returned as the result (a reply body, a last step's output).
    _check_sizes(node_id, out, reply[-1] if reply and reply[-1] is not replied else None, settings, sink=sink)


def _take_failure_edges(
    flow: CompiledFlow, node: CompiledNode, message: Message, error: str, attempts: int
) -> list[tuple[CompiledEdge, Message]] | None:
    """The messages a step that failed after its last attempt hands to its failure edges
    (SPEC §11), or None when none is taken (no failure edge, or none whose condition holds):
    then the execution fails."""
    edges = flow.failure_edges.get(node.id) or []
    if not edges:
        return None
    data = {
        "error": {
            "message": error,
            "step": node.id,
            "component": node.component.id if node.component else None,
            "attempts": attempts,
        },
        "input": message["data"],
    }
    taken: list[tuple[CompiledEdge, Message]] = []
    for edge in edges:
        out = data
        try:
            if edge.condition is not None and not truthy(edge.condition.evaluate(out)):
                continue
            if edge.mapper is not None:
                out = apply_mapper(edge.mapper, out)
                if out is None or out == {}:
                    raise StepFailed(node.id, f"mapper of edge {edge.id} yielded nothing", logged=True)
        except ExpressionError as exc:
            raise StepFailed(node.id, f"edge {edge.id}: {exc}", logged=True) from None
        taken.append((edge, {"data": out, "metadata": message["metadata"]}))
    return taken or None


def _step_timeout(settings: Settings, deadline: float | None) -> float:
    if deadline is None:
        return settings.step_timeout
    return max(min(settings.step_timeout, deadline - time.monotonic()), 0.0)


def error_outcome(
    execution: Claimed,
    *,
    status: str,
    error: str,
    log_message: str,
    step_id: str | None = None,
    component_id: str | None = None,
    finished_at: datetime | None = None,
) -> Outcome:
    """The outcome of an execution that did not run to its end in a runner: the flow could
    not run, or its runner was killed. One ``error`` log entry says why."""
    now = finished_at or utcnow()
    return Outcome(
        execution_id=execution.id,
        flow_id=execution.flow_id,
        tenant=execution.tenant,
        owner_user=execution.owner_user,
        created_at=execution.created_at,
        status=status,
        result=None,
        error=error,
        finished_at=now,
        logs=[
            {
                "timestamp": now,
                "level": "error",
                "message": log_message[:10_000],
                "tenant": execution.tenant,
                "user_id": execution.owner_user,
                "flow_id": execution.flow_id,
                "execution_id": execution.id,
                "step_id": step_id,
                "component_id": component_id,
                "data": None,
            }
        ],
    )


def _log(base: dict[str, Any], level: str, message: str, node: CompiledNode, data: Any) -> dict[str, Any]:
    return {
        **base,
        "timestamp": utcnow(),
        "level": level,
        "message": message[:10_000],
        "step_id": node.id,
        "component_id": node.component.id if node.component else None,
        "data": data,
    }
