"""The slot a runner shares with the engine, across real processes: a reading never mixes two
writes, even when the runner is stopped in the middle of one.

The engine's watchdog kills a runner when its main-thread CPU clock passes the deadline the
slot shows for the execution on its CPU. A reading that paired a new execution with a deadline
not yet written (0) once killed an innocent execution: a busy host had descheduled the runner
in the middle of its write (regression: one false "exceeded the 10 s CPU limit" in ~7,800
tiny webhooks)."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flowyard.runtime.ipc import SLOT_SIZE, Slot

# The writer publishes, for execution seq, the deadline seq * _D and nodes 1 then 2; the
# reader can thus tell a true record from a mix of two.
_D = 1_000_003

_HAMMER = f"""
import mmap, sys
from flowyard.runtime.ipc import Slot
slot = Slot(mmap.mmap(int(sys.argv[1]), 0))
print("ready", flush=True)
seq = 0
while True:
    seq += 1
    slot.enter(seq, seq * {_D}, 1)
    slot.step(2)
    slot.leave()
"""

# Stops itself inside enter(): __index__ runs while the deadline is being stored.
_PAUSED = """
import mmap, os, signal, sys
from flowyard.runtime.ipc import Slot
slot = Slot(mmap.mmap(int(sys.argv[1]), 0))
slot.enter(6, 6_000_000_000_000, 1)
slot.leave()

class Deadline:
    def __index__(self):
        os.kill(os.getpid(), signal.SIGSTOP)
        return 7_000_000_000_000

slot.enter(7, Deadline(), 3)
print("entered", flush=True)
sys.stdin.read()
"""


@contextmanager
def _writer(code: str) -> Iterator[tuple[subprocess.Popen[str], Slot]]:
    """A real process writing a fresh slot (a memfd, as the pool makes it)."""
    fd = os.memfd_create("test-slot")
    os.ftruncate(fd, SLOT_SIZE)
    slot = Slot(mmap.mmap(fd, SLOT_SIZE))
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), str(fd)],
        pass_fds=(fd,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(fd)
    try:
        yield proc, slot
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        slot.close()


def _wait_stopped(pid: int) -> None:
    _, status = os.waitpid(pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"writer ended: {status}"


@pytest.mark.slow
def test_a_writer_stopped_at_any_moment_never_shows_a_mixed_record() -> None:
    """What a descheduled runner looks like from the engine: stop it at random moments of a
    tight enter/step/leave loop and read the slot while it cannot move."""
    with _writer(_HAMMER) as (proc, slot):
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        stops = records = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline or records < 50:
            time.sleep(0.0005)
            os.kill(proc.pid, signal.SIGSTOP)
            _wait_stopped(proc.pid)
            stops += 1
            try:
                reading = slot.read()
                if reading is not None and reading[0]:
                    seq, cpu_deadline, node = reading[:3]
                    records += 1
                    assert (cpu_deadline, node in (1, 2)) == (seq * _D, True), (
                        f"stop {stops}: a mixed record {tuple(reading)}"
                    )
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            assert time.monotonic() < deadline + 30, f"{records} records seen in {stops} stops"


def test_a_writer_stopped_inside_a_write_shows_the_record_before_it() -> None:
    with _writer(_PAUSED) as (proc, slot):
        _wait_stopped(proc.pid)  # inside enter(7, ...), while its deadline is being stored
        reading = slot.read()
        assert reading is None or reading[0] != 7, f"a half-written record {tuple(reading)}"
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdout is not None and proc.stdout.readline() == "entered\n"
        reading = slot.read()
        assert reading is not None and tuple(reading[:4]) == (7, 7_000_000_000_000, 3, 0)
