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
from dataclasses import fields
from datetime import datetime
from typing import Any

import orjson

from flowyard.engine.records import Claimed, Outcome, StepRecord

FRAME = struct.Struct("<I")
MAX_FRAME = 512 * 1024 * 1024

# seq running now (0: none) | CPU deadline, ns of the runner's main-thread CPU clock |
# node index + 1 (0: none) | verdict the runner reached about itself
SLOT = struct.Struct("<QqII")
VERDICT_NONE, VERDICT_CPU, VERDICT_MEMORY = 0, 1, 2
VERDICTS = {VERDICT_CPU: "cpu", VERDICT_MEMORY: "memory"}

LOG_LEVELS = frozenset({"debug", "info", "warn", "error"})


class ProtocolError(Exception):
    """A runner sent something that is not a well-formed message."""


def frame(messages: Any) -> bytes:
    body = orjson.dumps(messages, default=str)
    return FRAME.pack(len(body)) + body


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


class Slot:
    """The shared slot, over any writable buffer (an mmap of the memfd)."""

    __slots__ = ("buf",)

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def enter(self, seq: int, cpu_deadline_ns: int, node: int) -> None:
        SLOT.pack_into(self.buf, 0, seq, cpu_deadline_ns, node, VERDICT_NONE)

    def leave(self) -> None:
        struct.pack_into("<Q", self.buf, 0, 0)

    def step(self, node: int) -> None:
        struct.pack_into("<I", self.buf, 16, node)

    def verdict(self, seq: int, node: int, verdict: int) -> None:
        SLOT.pack_into(self.buf, 0, seq, 0, node, verdict)

    def read(self) -> tuple[int, int, int, int]:
        seq, deadline, node, verdict = SLOT.unpack_from(self.buf, 0)
        return seq, deadline, node, verdict


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
    ]


def outcome_from_wire(w: Any, claimed: Claimed, flow_id: str, nodes: set[str]) -> Outcome:
    """Rebuild a runner's outcome; identity fields come from the engine, not the runner."""
    try:
        status, result, error, finished_at, steps, logs = w
        if status not in ("succeeded", "failed"):
            raise ProtocolError(f"status {status!r}")
        records = []
        for s in steps:
            record = StepRecord(*s)
            if record.node_id not in nodes or record.status not in ("succeeded", "failed"):
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
        )
    except ProtocolError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"malformed outcome: {exc}") from None
