"""What the engine and its runner processes say to each other, and how.

Frames are a 4-byte little-endian length and an orjson body: never pickle, since
a runner runs flow code and the engine must not execute what a runner sends.
Each frame holds a list of messages, so many executions cost one write.

The *slot* is a few bytes of memory shared with each runner (a memfd). The
runner writes into it which execution is on its CPU right now, up to which
value of its main thread's CPU clock it may stay there, and which step it is in.
The engine reads it to enforce limits from outside (a watchdog thread inside the
runner would not run while a native extension holds the GIL) and to learn whom
to blame after a runner died, even when the runner had no chance to say so.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from flowyard import isolate
from flowyard.queue.records import Claimed, Outcome, StepRecord

FRAME = struct.Struct("<I")
MAX_FRAME = 512 * 1024 * 1024

VERDICT_NONE, VERDICT_CPU, VERDICT_MEMORY = 0, 1, 2
VERDICTS = {VERDICT_CPU: "cpu", VERDICT_MEMORY: "memory"}

LOG_LEVELS = frozenset({"debug", "info", "warn", "error"})


class ProtocolError(Exception):
    """A runner sent something that is not a well-formed message."""


def frame(messages: Any) -> bytes:
    body = orjson.dumps(messages, default=str)
    return FRAME.pack(len(body)) + body


def frame_each(messages: Sequence[Any], on_poison: Callable[[Any, BaseException], Any | None]) -> bytes:
    """A frame of ``messages``, each encoded on its own (``isolate.py``): one that
    cannot be encoded (nested too deep for orjson, say) goes to ``on_poison``, which may
    return a message to send instead (it must encode), and never takes the others down."""
    substitutes: list[bytes] = []

    def poison(message: Any, exc: BaseException) -> None:
        substitute = on_poison(message, exc)
        if substitute is not None:
            substitutes.append(orjson.dumps(substitute, default=str))

    encoded = [body for _, body in isolate.each(messages, _dumps, poison)]
    body = b"[" + b",".join(encoded + substitutes) + b"]"
    return FRAME.pack(len(body)) + body


def _dumps(message: Any) -> bytes:
    return orjson.dumps(message, default=str)


async def read_frame(reader: asyncio.StreamReader) -> list[Any]:
    (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes")
    try:
        messages = orjson.loads(await reader.readexactly(size))
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(str(exc)) from None
    if not isinstance(messages, list):
        raise ProtocolError("a frame holds a list of messages")
    return messages


class Reading(NamedTuple):
    """One consistent state of a slot: what a single write left there."""

    seq: int  # the execution on the runner's CPU (0: none)
    cpu_deadline_ns: int  # until this value of the runner's main-thread CPU clock
    node: int  # its step: node index + 1 (0: none)
    verdict: int  # what the runner concluded about itself before it died
    generation: int  # how many writes came before (even: none under way)


# The slot is five 8-byte words: generation | seq | CPU deadline | node | verdict. A word is
# stored and loaded whole (an aligned 8-byte access, one instruction), but a record of
# several words is not: the runner can be descheduled between two of its stores, for as
# long as the host likes. So the slot is a seqlock. The runner, its only writer, makes the
# generation odd before it writes and even again after; the engine keeps a reading only if
# the generation was even before it and unchanged after it. (x86-64 keeps stores, and loads,
# in program order; that is what makes the ordering hold without fences.)
_GEN, _SEQ, _DEADLINE, _NODE, _VERDICT = range(5)
SLOT_SIZE = 5 * 8
_READ_TRIES = 3


class Slot:
    """The shared slot, over a writable buffer of SLOT_SIZE bytes (an mmap of the memfd)."""

    __slots__ = ("_buf", "_gen", "_words")

    def __init__(self, buf: Any) -> None:
        self._buf = buf
        self._words = memoryview(buf).cast("q")
        self._gen = self._words[_GEN]  # only the writer uses it: its own count

    # -- the runner writes ----------------------------------------------------------------

    def _begin(self) -> None:
        self._gen += 1
        self._words[_GEN] = self._gen

    def _end(self) -> None:
        self._gen += 1
        self._words[_GEN] = self._gen

    def enter(self, seq: int, cpu_deadline_ns: int, node: int) -> None:
        w, gen = self._words, self._gen  # _begin() and _end() inlined: once per resume
        w[_GEN] = gen + 1
        w[_SEQ] = seq
        w[_DEADLINE] = cpu_deadline_ns
        w[_NODE] = node
        w[_VERDICT] = VERDICT_NONE
        w[_GEN] = self._gen = gen + 2

    def leave(self) -> None:
        w, gen = self._words, self._gen
        w[_GEN] = gen + 1
        w[_SEQ] = 0
        w[_GEN] = self._gen = gen + 2

    def step(self, node: int) -> None:
        self._begin()
        self._words[_NODE] = node
        self._end()

    def verdict(self, seq: int, node: int, verdict: int) -> None:
        w = self._words
        self._begin()
        w[_SEQ] = seq
        w[_DEADLINE] = 0
        w[_NODE] = node
        w[_VERDICT] = verdict
        self._end()

    # -- the engine reads -------------------------------------------------------------------

    def read(self) -> Reading | None:
        """The slot as the last complete write left it; None while a write is under way
        (the runner may be descheduled in the middle of one: look again later)."""
        w = self._words
        for _ in range(_READ_TRIES):
            gen = w[_GEN]
            if gen & 1:
                continue
            reading = Reading(w[_SEQ], w[_DEADLINE], w[_NODE], w[_VERDICT], gen)
            if w[_GEN] == gen:
                return reading
        return None

    def unchanged(self, reading: Reading) -> bool:
        """Nothing was written since ``reading``: whoever it showed on the CPU is still there."""
        return bool(self._words[_GEN] == reading.generation)

    def close(self) -> None:
        self._words.release()
        self._buf.close()


# -- executions across the pipe ------------------------------------------------------


_CLAIMED_FIELDS = tuple(f.name for f in fields(Claimed))
_CLAIMED_TIMES = ("created_at", "scheduled_for")


def claimed_to_wire(c: Claimed) -> list[Any]:
    return [getattr(c, name) for name in _CLAIMED_FIELDS]


def claimed_from_wire(w: list[Any]) -> Claimed:
    c = Claimed(*w)
    for name in _CLAIMED_TIMES:
        value = getattr(c, name)
        setattr(c, name, datetime.fromisoformat(value) if value else None)
    return c


_STEP_FIELDS = (
    "node_id",
    "component_id",
    "function",
    "status",
    "runs",
    "messages_in",
    "messages_out",
    "duration_ms",
    "started_at",
    "finished_at",
    "error",
    "output",
    "position",
    "attempts",
    "attempt_errors",
    "input",  # a failed step's message, where a retry starts (SPEC §11)
    "inputs",  # a sample of the data it received (the step debugger)
)


def outcome_to_wire(o: Outcome) -> list[Any]:
    """Only what the run decided: who the execution is, the engine knows better."""
    return [
        o.status,
        o.result,
        o.error,
        o.finished_at,
        [[getattr(s, f) for f in _STEP_FIELDS] for s in o.steps],
        [
            [e["timestamp"], e["level"], e["message"], e["step_id"], e["component_id"], e["data"]]
            for e in o.logs
        ],
        o.resume_at,
        o.state,
    ]


def outcome_from_wire(w: Any, claimed: Claimed, flow_id: str, nodes: set[str]) -> Outcome:
    """Rebuild a runner's outcome; identity fields come from the engine, not the runner."""
    try:
        status, result, error, finished_at, steps, logs, *parked = w
        resume_at, state = (*parked, None, None)[:2]  # a parked outcome's (SPEC §11)
        if status not in ("succeeded", "failed", "waiting") or (status == "waiting") != bool(resume_at):
            raise ProtocolError(f"status {status!r}")
        records = []
        for s in steps:
            record = StepRecord(*s)
            if record.node_id not in nodes or record.status not in ("succeeded", "failed", "waiting"):
                raise ProtocolError(f"step {record.node_id!r}")
            record.started_at = datetime.fromisoformat(s[8])
            record.finished_at = datetime.fromisoformat(s[9])
            records.append(record)
        base = {
            "tenant": claimed.tenant,
            "user_id": claimed.owner_user,
            "flow_id": flow_id,
            "execution_id": claimed.id,
        }
        entries = [
            {
                **base,
                "timestamp": datetime.fromisoformat(ts),
                "level": level if level in LOG_LEVELS else "info",
                "message": str(message)[:10_000],
                "step_id": step_id if step_id in nodes else None,
                "component_id": component_id if isinstance(component_id, str) else None,
                "data": data,
            }
            for ts, level, message, step_id, component_id, data in logs
        ]
        return Outcome(
            execution_id=claimed.id,
            flow_id=flow_id,
            tenant=claimed.tenant,
            owner_user=claimed.owner_user,
            created_at=claimed.created_at,
            status=status,
            result=result,
            error=None if error is None else str(error),
            finished_at=datetime.fromisoformat(finished_at),
            steps=records,
            logs=entries,
            resume_at=datetime.fromisoformat(resume_at) if resume_at else None,
            state=state if status == "waiting" else None,
        )
    except ProtocolError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"malformed outcome: {exc}") from None
