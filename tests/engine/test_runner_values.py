"""A runner process never sends what it cannot: a step whose output nests deeper than
``jsonvalue.MAX_DEPTH`` fails with the reason, and an outcome JSON cannot hold (an integer beyond
64 bits from a component) fails its own execution; the executions sharing the frame go on.

Runs ``RunnerProcess`` in this process, over a real pipe, with components of its own."""

from __future__ import annotations

import asyncio
import mmap
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from flowyard.components.builtins import WEBHOOK
from flowyard.components.context import StepContext
from flowyard.components.registry import Component, Message, Registry
from flowyard.config import Settings
from flowyard.jsonvalue import MAX_DEPTH
from flowyard.queue.records import Claimed
from flowyard.runtime.ipc import SLOT_SIZE, Slot, claimed_to_wire, read_frame
from flowyard.runtime.runner_process import RunnerProcess


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def returning(value: Any) -> Component:
    async def go(message: Message, _ctx: StepContext) -> Message:
        return {"data": value, "metadata": message["metadata"]}

    return Component(id=f"c{id(value)}", description="test", functions={"go": go}, default_function="go")


def claimed(n: int) -> Claimed:
    now = datetime.now(UTC)
    return Claimed(f"{n:024d}", "f" * 24, 1, None, None, "webhook", {"n": n}, 1, now, None)


async def test_what_json_cannot_carry_fails_its_execution_alone(tmp_path: Path) -> None:
    cases = {
        "big": returning({"n": 2**70}),
        "deep": returning(nested(MAX_DEPTH + 1)),
        "limit": returning(nested(MAX_DEPTH)),
        "fine": returning({"ok": True}),
    }
    registry = Registry({c.id: c for c in (WEBHOOK, *cases.values())})
    settings = Settings(data_dir=tmp_path)
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
    runner = RunnerProcess(settings, registry, Slot(mmap.mmap(-1, SLOT_SIZE)), write_fd)
    runner._transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(write_fd, "wb", 0))
    async with httpx.AsyncClient() as http:
        runner.http = http
        for n, (key, component) in enumerate(cases.items()):
            graph = {
                "nodes": [{"id": "in", "componentId": "webhook"}, {"id": "s", "componentId": component.id}]
            }
            graph["edges"] = [{"source": "in", "target": "s"}]
            spec = {
                "id": "f" * 24,
                "version": 1,
                "tenant": None,
                "owner": None,
                "graph": graph,
                "credentials": {},
            }
            runner.handle(["flow", key, spec])
            wire = orjson.loads(orjson.dumps(claimed_to_wire(claimed(n + 1))))  # as the engine sends it
            runner.handle(["run", n + 1, key, wire])
        done: dict[int, Any] = {}
        async with asyncio.timeout(30):
            while len(done) < len(cases):
                for message in await read_frame(reader):
                    if message[0] == "done":
                        done[message[1]] = message[2]
    runner._transport.close()
    big, deep, limit, fine = (done[n] for n in (1, 2, 3, 4))
    # wire: status, result, error, finished at, steps, logs
    assert big[0] == "failed" and "Integer exceeds 64-bit range" in big[2], big[2]
    assert deep[0] == "failed", deep
    assert (
        deep[2]
        == f"step s failed: its output nests deeper than {MAX_DEPTH} levels of arrays and objects (the limit)"
    )
    assert deep[1] is None
    assert limit[0] == "succeeded" and limit[1] == {"data": nested(MAX_DEPTH)}
    assert fine[0] == "succeeded" and fine[1] == {"data": {"ok": True}}
