"""The cross-process notification channel: what is staged in a transaction is
delivered only when it commits (PostgreSQL), datagrams reach every other process
of the same database (SQLite), and outcomes travel with the notice when small."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from flowyard.db.session import Database
from flowyard.queue.hub import CompletionHub
from flowyard.queue.notify import (
    WORK,
    LocalNotifier,
    Notifier,
    PostgresNotifier,
    finished_messages,
    open_notifier,
    socket_directory,
)


class Seen:
    def __init__(self, notifier: Notifier) -> None:
        self.work = 0
        self.finished: list[tuple[str, Any]] = []
        self.event = asyncio.Event()
        notifier.subscribe(on_work=self._work, on_finished=self._finished)

    def _work(self) -> None:
        self.work += 1
        self.event.set()

    def _finished(self, items: list[tuple[str, Any]]) -> None:
        self.finished.extend(items)
        self.event.set()

    async def next(self, within: float = 5.0) -> None:
        async with asyncio.timeout(within):
            await self.event.wait()
        self.event.clear()


def test_finished_messages_carry_small_outcomes_and_split_at_the_payload_limit() -> None:
    big = {"blob": "x" * 5000}
    messages = finished_messages(
        [("e1", "succeeded", {"data": 1}, None), ("e2", "succeeded", big, None), "e3"]
        + [(f"m{i}", "failed", None, "boom " * 20) for i in range(100)]
    )
    assert len(messages) > 1 and all(len(m) <= 7000 for m in messages)
    hub = CompletionHub()
    notifier = Notifier()
    notifier.subscribe(on_finished=hub.finish)
    for m in messages:
        notifier._dispatch(m)
    assert hub._recent["e1"] == ("succeeded", {"data": 1}, None)
    assert hub._recent["e2"] is None, "too large to travel: the waiter reads the row"
    assert hub._recent["e3"] is None
    assert hub._recent["m99"] == ("failed", None, "boom " * 20)
    notifier._dispatch(b"garbage")  # ignored, not raised


async def test_hub_answers_a_waiter_that_registers_after_the_notice() -> None:
    hub = CompletionHub()
    hub.finish([("e1", ("succeeded", {"data": 2}, None))])
    fut = hub.register("e1")
    assert fut.done() and fut.result() == ("succeeded", {"data": 2}, None)
    hub.forget("e1")
    assert not hub.register("e1").done()
    # Outcomes of this process's worker may be large: a late waiter is told to read the row.
    waiting = hub.register("e2")
    hub.finish([("e2", ("succeeded", {"big": "x" * 100}, None))], remember=False)
    assert waiting.result() == ("succeeded", {"big": "x" * 100}, None)
    assert hub.register("e2").result() is None


async def test_local_datagrams_reach_other_processes_and_stale_sockets_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "n"
    a, b, c = LocalNotifier(directory), LocalNotifier(directory), LocalNotifier(directory)
    seen_b, seen_c = Seen(b), Seen(c)
    seen_a = Seen(a)
    for n in (a, b, c):
        await n.start()
    # A socket file nobody listens on any more (a SIGKILLed process).
    stale = directory / "999999-dead.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(stale))
    dead.close()
    try:
        a.committed([WORK])
        await seen_b.next()
        await seen_c.next()
        assert seen_b.work == seen_c.work == 1
        assert seen_a.work == 0, "the sender was told directly, not through its own socket"
        assert not stale.exists()
        a.committed(finished_messages([("e1", "succeeded", {"data": [1]}, None)]))
        await seen_b.next()
        assert seen_b.finished == [("e1", ("succeeded", {"data": [1]}, None))]
    finally:
        for n in (a, b, c):
            await n.close()
    assert list(directory.iterdir()) == [], "sockets are removed on close"


async def test_a_directory_others_may_enter_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    n = LocalNotifier(shared)
    await n.start()
    try:
        assert not n.active and list(shared.iterdir()) == []
    finally:
        await n.close()


def test_socket_directory_fits_a_unix_socket_address(tmp_path: Path) -> None:
    short = socket_directory(Path("/tmp/x/flowyard.db"))
    assert short == Path("/tmp/x/flowyard.db.notify")
    deep = tmp_path / ("d" * 120) / "flowyard.db"
    other = socket_directory(deep)
    assert len(str(other)) < 80 and other == socket_directory(deep), "stable per database"
    assert isinstance(open_notifier("sqlite+aiosqlite:///:memory:"), Notifier)
    assert not isinstance(open_notifier("sqlite+aiosqlite:///:memory:"), LocalNotifier)


async def test_postgres_notice_is_sent_only_when_the_transaction_commits(postgres_url: str) -> None:
    listener = open_notifier(postgres_url)
    assert isinstance(listener, PostgresNotifier)
    seen = Seen(listener)
    await listener.start()
    db = Database(postgres_url)
    try:
        assert listener.active
        await asyncio.sleep(0.1)
        seen.event.clear()
        seen.work = 0  # the wake-up given on connecting
        with pytest.raises(RuntimeError):
            async with db.write() as session:
                await listener.stage(session, [WORK])
                raise RuntimeError("rolled back")
        async with db.write() as session:
            await listener.stage(session, finished_messages([("e9", "failed", None, "no")]))
            await asyncio.sleep(0.3)
            assert not seen.finished, "nothing is delivered before the commit"
        await seen.next()
        assert seen.finished == [("e9", ("failed", None, "no"))]
        assert seen.work == 0, "the rolled-back notice never arrived"
    finally:
        await listener.close()
        await db.dispose()
