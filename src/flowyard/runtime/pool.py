"""The runner pool: supervised runner processes where flow code runs, with limits.

The worker keeps everything that touches the database (claiming, leases,
reaping, recording outcomes); the pool hands each claimed execution with its
flow's spec to the least-loaded runner (``flowyard.runtime.runner_process``) and
returns the outcome. Runners are started with fork+exec (never forked from this
process with its database sockets), cache each flow version they were sent, and
run many executions at once.

Which runner an execution goes to, and who is blamed when a runner dies, is decided
by ``flowyard.runtime.placement`` (pure logic): a runner holds executions of one
tenant group at a time, so a runner death only touches the group that caused it.

Limits are enforced from here, where nothing a flow does can stop it: a watchdog
task reads each runner's slot (which execution is on its CPU, and until when)
against the runner's main-thread CPU clock, its resident memory, and every
execution's wall-time deadline, and kills the runner that crosses one. The culprit
(placement decides: from the slot, or by re-running the suspects alone) fails with
the limit named; it is never handed to a runner again. A dead runner is replaced at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from flowyard import isolate, metrics
from flowyard.config import Settings
from flowyard.queue.store import Claimed, Outcome, queue_group_of
from flowyard.runtime.ipc import (
    SLOT_SIZE,
    VERDICTS,
    ProtocolError,
    Slot,
    claimed_to_wire,
    frame,
    frame_each,
    outcome_from_wire,
    read_frame,
)
from flowyard.runtime.placement import MAX_LOSSES, Placement
from flowyard.runtime.runner import CompiledFlow, error_outcome, limit_message

log = logging.getLogger(__name__)

_WATCH_INTERVAL = 0.05
_WALL_MARGIN = 5.0  # the runner fails an overdue execution itself; we kill only if it cannot
_FLOWS_PER_RUNNER = 256
_START_TIMEOUT = 60.0
_STDERR_TAIL = 20
_PAGE = os.sysconf("SC_PAGE_SIZE")
_CHILD_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)
_generation = itertools.count(1)


@dataclass
class FlowSpec:
    """What a runner needs to run a flow version: sent once per runner, cached there."""

    flow_id: str
    version: int
    tenant: str | None
    owner_user: str | None
    graph: dict[str, Any]
    credentials: dict[str, dict[str, Any]]
    nodes: list[tuple[str, str | None]]
    key: str = ""
    loaded_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        # A new key for every load, so re-read credentials reach runners as a new spec.
        self.key = self.key or f"{self.flow_id}:{self.version}:{next(_generation)}"
        self.node_ids = {n for n, _ in self.nodes}

    @classmethod
    def of(cls, flow: CompiledFlow, graph: dict[str, Any]) -> FlowSpec:
        return cls(
            flow.flow_id,
            flow.version,
            flow.tenant,
            flow.owner_user,
            graph,
            flow.credentials,
            [(nid, n.component.id if n.component else None) for nid, n in flow.nodes.items()],
        )

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.flow_id,
            "version": self.version,
            "tenant": self.tenant,
            "owner": self.owner_user,
            "graph": self.graph,
            "credentials": self.credentials,
        }

    def node(self, index: int) -> tuple[str | None, str | None]:
        return self.nodes[index - 1] if 0 < index <= len(self.nodes) else (None, None)


@dataclass(eq=False)
class _Job:
    seq: int
    spec: FlowSpec
    claimed: Claimed
    future: asyncio.Future[Outcome]
    deadline: float = 0.0
    runner: _Runner | None = None


@dataclass(eq=False)
class _Runner:
    index: int
    slot: Slot
    rid: int = 0
    surge: bool = False
    retiring: bool = False  # stopped empty by placement (idle, or demoted): nobody to blame
    replace: bool = False  # retiring, to be replaced by a fresh one (a demoted base runner)
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    dead: bool = False
    jobs: dict[int, _Job] = field(default_factory=dict)
    flows: OrderedDict[str, None] = field(default_factory=OrderedDict)
    outbox: list[Any] = field(default_factory=list)
    kill_reason: tuple[int, int, str] | None = None  # (seq, node, limit) decided here
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=_STDERR_TAIL))
    busy_since: int | None = None  # generation of the slot seen busy at the last watch
    stalled: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0


class RunnerPool:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.size = settings.runner_count()
        self.warm = min(self.size, settings.runners_warm)
        self.slots = self.size * settings.runner_concurrency
        self._runners: list[_Runner] = []
        self._jobs: dict[int, _Job] = {}
        self._seq = itertools.count(1)
        self._rids = itertools.count(1)
        self._surge_index = itertools.count(self.size)
        self.placement = Placement(
            base=self.size,
            capacity=settings.runner_concurrency,
            surge=settings.runner_surge,
            surge_idle_seconds=settings.runner_surge_idle_seconds,
            quarantine_seconds=settings.runner_quarantine_seconds,
            penalty_seconds=settings.runner_penalty_seconds,
            linger_seconds=settings.runner_linger_seconds,
            demote=settings.runner_demote_nice > 0,
            warm=self.warm,
        )
        self._base_indexes: set[int] = set()  # base runners' indexes started (or up) now
        self._closing = False
        self._watch: asyncio.Task[None] | None = None
        self._spawns: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()
        self.replaced = 0
        self.limit_kills = 0
        self.reruns = 0
        self.isolated = 0
        self.demoted = 0
        self._reheat = False

    async def start(self) -> None:
        """Start the warm runners in the background; work handed in meanwhile waits for the
        first. The other base runners start when placement asks for them."""
        for i in range(self.warm):
            self._base_indexes.add(i)
            self._spawn(i, delay=0.0)
        self._watch = asyncio.create_task(self._watchdog(), name="flowyard-runner-watchdog")

    async def wait_ready(self) -> bool:
        """Wait until a runner can take work (start-up); False if none did in time."""
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                await self._ready.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
        for task in list(self._spawns):
            task.cancel()
        await asyncio.gather(*self._spawns, return_exceptions=True)
        for r in self._runners:
            _sigkill(r)
        for r in self._runners:
            if r.proc is not None:
                with contextlib.suppress(Exception):
                    await r.proc.wait()
            for task in r.tasks:
                task.cancel()
            await asyncio.gather(*r.tasks, return_exceptions=True)
            self._fail_all(r, "the engine stopped")
        for job in self._jobs.values():
            if not job.future.done():
                job.future.set_exception(RuntimeError("the runner pool stopped"))
        self._jobs.clear()
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)

    def waiting_ids(self) -> set[str]:
        """Executions handed to the pool that wait for a runner slot (none of their code ran)."""
        return {job.claimed.id for job in self._jobs.values() if job.runner is None}

    def stats(self) -> dict[str, Any]:
        return {
            "runners": [
                {"pid": r.pid, "ready": r.ready, "running": len(r.jobs), "surge": r.surge}
                for r in self._runners
                if not r.dead
            ],
            "replaced": self.replaced,
            "limitKills": self.limit_kills,
            "reruns": self.reruns,
            "isolatedReruns": self.isolated,
            "demoted": self.demoted,
        }

    async def run(self, spec: FlowSpec, claimed: Claimed) -> Outcome:
        """Run one execution in a runner; returns its outcome whatever happens to runners."""
        loop = asyncio.get_running_loop()
        job = _Job(next(self._seq), spec, claimed, loop.create_future())
        self._jobs[job.seq] = job
        self.placement.submit(job.seq, queue_group_of(claimed.tenant, claimed.owner_user), time.monotonic())
        self._pump()
        try:
            return await job.future
        except asyncio.CancelledError:
            r = job.runner
            if r is not None and r.jobs.pop(job.seq, None) is not None and not r.dead:
                self._send(r, ["cancel", job.seq])
            raise
        finally:
            self._jobs.pop(job.seq, None)
            self.placement.finish(job.seq, time.monotonic())
            if not self._closing:
                self._pump()

    # -- dispatch ----------------------------------------------------------------------

    def _pump(self) -> None:
        """Do what placement says: place waiting executions, start or stop runners."""
        if self._closing:
            return
        plan = self.placement.plan(time.monotonic())
        by_rid = {r.rid: r for r in self._runners if r.ready and not r.dead}
        for seq, rid in plan.place:
            job, r = self._jobs.get(seq), by_rid.get(rid)
            if job is None or r is None or job.future.done():  # cannot happen; never lose a job
                self.placement.finish(seq, time.monotonic())
                if job is not None and not job.future.done():
                    job.future.set_exception(RuntimeError("placement named a runner that is gone"))
                continue
            self._send_job(r, job)
        for _ in range(plan.start_base):
            # Its index names it in logs; one being stopped still holds its index till buried.
            free = set(range(self.size)) - self._base_indexes
            index = min(free) if free else next(self._surge_index)
            self._base_indexes.add(index)
            self._spawn(index, delay=0.0)
        for _ in range(plan.start_surge):
            self._spawn(next(self._surge_index), delay=0.0, surge=True)
        for rid in plan.retire:  # empty: nobody to blame
            if (r := by_rid.get(rid)) is not None:
                r.retiring = True
                _sigkill(r)
        for rid in plan.recycle:  # empty and demoted: a fresh one in its place
            if (r := by_rid.get(rid)) is not None:
                r.retiring = r.replace = True
                _sigkill(r)
        if plan.demote:
            for rid in plan.demote:
                if (r := by_rid.get(rid)) is not None:
                    _renice(r.pid, self._demoted_nice)
                    self.demoted += 1

    def _send_job(self, r: _Runner, job: _Job) -> None:
        key = job.spec.key
        if key in r.flows:
            r.flows.move_to_end(key)
        else:
            self._send(r, ["flow", key, job.spec.wire()])
            r.flows[key] = None
            if len(r.flows) > _FLOWS_PER_RUNNER:
                old, _ = r.flows.popitem(last=False)
                self._send(r, ["drop", old])
        job.runner = r
        job.deadline = time.monotonic() + self.settings.execution_wall_seconds + _WALL_MARGIN
        r.jobs[job.seq] = job
        self._send(r, ["run", job.seq, key, claimed_to_wire(job.claimed)])

    def _send(self, r: _Runner, message: Any) -> None:
        if not r.outbox:
            asyncio.get_running_loop().call_soon(self._flush, r)
        r.outbox.append(message)

    def _flush(self, r: _Runner) -> None:
        batch, r.outbox = r.outbox, []
        if batch and not r.dead and r.proc is not None and r.proc.stdin is not None:
            data = frame_each(batch, lambda message, exc: self._unsendable(r, message, exc))
            with contextlib.suppress(ConnectionError, RuntimeError):
                r.proc.stdin.write(data)

    def _unsendable(self, r: _Runner, message: Any, exc: BaseException) -> None:
        """A message that cannot be encoded fails its own execution(s), no other
        (``isolate.py``)."""
        why = isolate.reason(exc)
        if message[0] == "run":
            self._fail_alone(r, r.jobs.get(message[1]), f"its input could not be sent to a runner: {why}")
        elif message[0] == "flow":
            key = message[1]
            r.flows.pop(key, None)  # not sent: sent again with the next execution of the flow
            log.error("flow spec %s could not be sent to runner %d: %s", key, r.index, why)
            for job in [j for j in r.jobs.values() if j.spec.key == key]:
                self._fail_alone(r, job, f"its flow could not be sent to a runner: {why}")
        else:
            log.error("a %r message could not be sent to runner %d: %s", message[0], r.index, why)

    def _fail_alone(self, r: _Runner, job: _Job | None, why: str) -> None:
        if job is None:
            return
        r.jobs.pop(job.seq, None)
        self.placement.finish(job.seq, time.monotonic())
        metrics.poison("dispatch")
        log.error("execution %s failed: %s", job.claimed.id, why)
        if not job.future.done():
            job.future.set_result(error_outcome(job.claimed, status="failed", error=why, log_message=why))

    # -- runner life ---------------------------------------------------------------------

    @property
    def _demoted_nice(self) -> int:
        """The niceness of a demoted runner (at most 19, the lowest priority)."""
        return min(19, self.settings.runner_nice + self.settings.runner_demote_nice)

    def _spawn(self, index: int, delay: float, surge: bool = False, reserved_for: str | None = None) -> None:
        task = asyncio.create_task(
            self._run_runner(index, delay, surge, reserved_for), name=f"flowyard-runner-{index}"
        )
        self._spawns.add(task)
        task.add_done_callback(self._spawns.discard)

    async def _run_runner(self, index: int, delay: float, surge: bool, reserved_for: str | None) -> None:
        if delay:
            await asyncio.sleep(delay)
        # For a penalised tenant: demoted from the start.
        nice = self.settings.runner_nice if reserved_for is None else self._demoted_nice
        fd = os.memfd_create(f"flowyard-runner-{index}")
        try:
            os.ftruncate(fd, SLOT_SIZE)
            r = _Runner(index, Slot(mmap.mmap(fd, SLOT_SIZE)), rid=next(self._rids), surge=surge)
            r.proc = await _start_process(fd)
            with contextlib.suppress(OSError):  # niced before its imports, not after them
                os.setpriority(os.PRIO_PROCESS, r.proc.pid, nice)
        except OSError as exc:  # fork or exec failed (out of processes, memory): try again later
            log.error("cannot start runner %d: %s", index, exc)
            if surge:
                self.placement.runner_start_failed(surge=True)
            elif not self._closing:
                self._spawn(index, delay=2.0)
            return
        finally:
            os.close(fd)
        self._runners = [x for x in self._runners if not x.dead and x.index != index] + [r]
        assert r.proc.stdin is not None and r.proc.stdout is not None and r.proc.stderr is not None
        r.proc.stdin.write(frame_config(self.settings, nice))
        r.tasks.append(asyncio.create_task(self._stderr(r), name=f"flowyard-runner-{index}-stderr"))
        started = time.monotonic()
        try:
            try:
                async with asyncio.timeout(_START_TIMEOUT):
                    hello = await read_frame(r.proc.stdout)
                if not hello or hello[0][0] != "ready":
                    raise ProtocolError(f"unexpected greeting {hello!r:.100}")
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                log.error(
                    "runner %d did not start (%s): %s", index, type(exc).__name__, " | ".join(r.stderr_tail)
                )
                if surge:
                    self.placement.runner_start_failed(surge=True)
                return
            r.ready = True
            metrics.runner_alive(1)
            self.placement.runner_up(r.rid, surge=surge, now=time.monotonic(), reserved_for=reserved_for)
            self._ready.set()
            log.debug("runner %d started (pid %d)%s", index, r.pid, " (surge)" if surge else "")
            self._pump()
            await self._read(r)
        finally:
            await self._bury(r, lived=time.monotonic() - started)

    async def _read(self, r: _Runner) -> None:
        assert r.proc is not None and r.proc.stdout is not None
        while True:
            try:
                messages = await read_frame(r.proc.stdout)
            except asyncio.IncompleteReadError:
                return
            except ProtocolError as exc:
                log.error("runner %d broke the protocol (%s); replacing it", r.index, exc)
                return
            for message in messages:
                job = None
                try:
                    if message[0] == "refused":  # the runner could not take this one
                        _, seq, why = message
                        self._fail_alone(r, r.jobs.get(seq), f"its runner could not take it: {why}"[:2000])
                        continue
                    if message[0] != "done":
                        raise ProtocolError(f"unknown message {message[0]!r}")
                    _, seq, wire = message
                    job = r.jobs.pop(seq, None)
                    if job is None:
                        continue  # cancelled meanwhile
                    self.placement.finish(seq, time.monotonic())
                    outcome = outcome_from_wire(wire, job.claimed, job.spec.flow_id, job.spec.node_ids)
                except (ProtocolError, ValueError, TypeError, IndexError) as exc:
                    log.error("runner %d sent a malformed message (%s); replacing it", r.index, exc)
                    if job is not None and not job.future.done():
                        why = "its runner process reported a malformed outcome"
                        job.future.set_result(
                            error_outcome(job.claimed, status="failed", error=why, log_message=why)
                        )
                    return
                if not job.future.done():
                    job.future.set_result(outcome)

    async def _stderr(self, r: _Runner) -> None:
        assert r.proc is not None and r.proc.stderr is not None
        async for raw in r.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            r.stderr_tail.append(line)
            log.warning("runner %d (pid %d): %s", r.index, r.pid, line[:2000])

    def _kill(self, r: _Runner, seq: int, node: int, limit: str) -> None:
        if r.kill_reason is None:
            r.kill_reason = (seq, node, limit)
            self.limit_kills += 1
        self.placement.condemn(r.rid)
        _sigkill(r)

    async def _bury(self, r: _Runner, lived: float) -> None:
        """The runner is gone (or must go): blame, re-run, replace."""
        r.dead = True
        if r.ready:
            metrics.runner_alive(-1)
        r.ready = False
        assert r.proc is not None
        _sigkill(r)
        rc = await r.proc.wait()
        for task in r.tasks:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(task, 1.0)
        if self._closing:
            return
        # Unreadable only if it died in the middle of a write: then the slot names nobody.
        seq, _deadline, node, verdict, _gen = r.slot.read() or (0, 0, 0, 0, 0)
        r.slot.close()
        reason = r.kill_reason
        if reason is None and verdict in VERDICTS:
            reason = (seq, node, VERDICTS[verdict])
        if reason is None and seq:
            # Died on its own while an execution was on its CPU: that execution did it.
            tail = " ".join(r.stderr_tail)
            oom = "memory allocation of" in tail or "MemoryError" in tail
            reason = (seq, node, "memory" if oom else f"crash:{_describe(rc)}")
        guilty, g_node, limit = reason if reason is not None else (0, 0, "")
        jobs = {seq: job for seq, job in r.jobs.items() if not job.future.done()}
        r.jobs.clear()
        if r.retiring and not jobs:
            self.placement.gone(r.rid)
            if r.replace:
                self._spawn(r.index, delay=0.0)  # a demoted base runner: a fresh one in its place
            elif not r.surge:
                self._base_indexes.discard(r.index)  # idle: started again on demand
            return
        metrics.runner_killed(limit)
        kind = "crash" if limit.startswith("crash:") else limit
        death = self.placement.died(r.rid, guilty or None, kind, time.monotonic())
        log.warning(
            "runner %d (pid %d) %s; %d execution(s) aboard%s%s",
            r.index,
            r.pid,
            _describe(rc),
            len(jobs),
            f", culprit: execution {jobs[death.culprit].claimed.id} ({limit or 'died alone'})"
            if death.culprit in jobs
            else ", no certain culprit",
            f"; {len(death.suspects)} suspect(s) run again alone" if death.suspects else "",
        )
        for job in jobs.values():
            job.runner = None
        if death.culprit in jobs:
            job = jobs[death.culprit]
            job.future.set_result(self._verdict(job, g_node if death.culprit == guilty else 0, limit))
        for seq in death.lost:
            job = jobs[seq]
            why = f"its runner process died {MAX_LOSSES} times while running it"
            job.future.set_result(
                error_outcome(job.claimed, status="failed", error=why, log_message=f"execution failed: {why}")
            )
        for _ in death.rerun:
            self.reruns += 1
            metrics.execution_rerun()
        for _ in death.suspects:
            self.reruns += 1
            self.isolated += 1
            metrics.execution_rerun()
        self.replaced += 1
        if not r.surge:
            # Back off when runners die young (a broken install), not when a flow was killed.
            delay = 0.0 if guilty or jobs or lived > 5 else min(5.0, 0.5 * (1 + self.replaced % 8))
            self._spawn(r.index, delay=delay, reserved_for=self.placement.reserve_replacement(death))
        self._pump()

    def _verdict(self, job: _Job, node: int, limit: str) -> Outcome:
        step, component = job.spec.node(node)
        who = f"step {step}" if step else "the execution"
        if limit.startswith("crash:"):
            what = f"crashed its runner process ({limit[6:]})"
        else:
            what = limit_message(limit, self.settings)
        error = f"{who} {what}"
        return error_outcome(
            job.claimed,
            status="failed",
            error=error,
            log_message=f"{error}; its runner process was killed and replaced",
            step_id=step,
            component_id=component,
        )

    def _fail_all(self, r: _Runner, why: str) -> None:
        for job in r.jobs.values():
            if not job.future.done():
                job.future.set_exception(RuntimeError(why))
        r.jobs.clear()

    # -- limits -----------------------------------------------------------------------

    async def _watchdog(self) -> None:
        limit_rss = self.settings.runner_memory_mb * 1024 * 1024
        for tick in itertools.count():
            await asyncio.sleep(_WATCH_INTERVAL)
            now = time.monotonic()
            if tick % 20 == 0:
                self._pump()  # quarantines that ended, surge runners idle long enough
            self._reheat = False
            for r in self._runners:
                if r.dead or not r.ready or r.kill_reason is not None:
                    continue
                try:
                    self._watch_one(r, now, limit_rss)
                except (OSError, ValueError):
                    continue  # it died between our reads; _bury handles it
            if self._reheat:
                self._pump()  # a runner's loop was taken or freed: placement may move

    def _watch_one(self, r: _Runner, now: float, limit_rss: int) -> None:
        # None: the runner is in the middle of a write (perhaps descheduled there), so it is
        # in our code, not a flow's: CPU and memory are judged at the next tick.
        reading = r.slot.read()
        seq = reading.seq if reading is not None else 0
        node = reading.node if reading is not None else 0
        if reading is not None and seq:
            cpu = _thread_cpu_ns(r.pid)
            # Unchanged since the reading: the execution has been on the CPU all along, from
            # the moment it entered with this deadline until after the clock was read.
            if cpu > reading.cpu_deadline_ns and r.slot.unchanged(reading):
                self._kill(r, seq, node, "cpu")
                return
            r.stalled = r.busy_since == reading.generation
            r.busy_since = reading.generation
        elif reading is not None:
            r.stalled = False
            r.busy_since = None
        if reading is not None and self.placement.heat(r.rid, r.stalled):
            self._reheat = True
        if reading is not None and _rss(r.pid) > limit_rss:
            self._kill(r, seq, node, "memory")
            return
        for job in r.jobs.values():
            if now > job.deadline:
                # A runner that cannot fail an overdue execution itself is stuck: if an
                # execution holds its thread, that one; else the overdue one.
                culprit = seq if seq in r.jobs else job.seq
                self._kill(r, culprit, node if seq else 0, "wall")
                return


async def _start_process(slot_fd: int) -> asyncio.subprocess.Process:
    """fork+exec a fresh interpreter: nothing of this process (database connections, event
    loop, secrets in the environment) reaches the runner but the slot and three pipes."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "flowyard.runtime.runner_process",
        str(slot_fd),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        pass_fds=(slot_fd,),
        env={k: v for k in _CHILD_ENV if (v := os.environ.get(k)) is not None} | {"MALLOC_ARENA_MAX": "2"},
    )


def frame_config(settings: Settings, nice: int | None = None) -> bytes:
    """The runner's first frame: its settings (no secrets, no database) and niceness."""
    private = {"admin_username", "database_url"} | {
        name for name in type(settings).model_fields if isinstance(getattr(settings, name), SecretStr)
    }
    body = settings.model_dump(mode="json", exclude=private)
    return frame({"settings": body, "nice": settings.runner_nice if nice is None else nice})


def _sigkill(r: _Runner) -> None:
    # os.kill, not Process.kill(): that polls first and may reap the child behind asyncio's
    # back, losing its exit status. Until it is reaped, the pid cannot name another process.
    if r.proc is not None and r.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.proc.pid, signal.SIGKILL)


def _renice(pid: int, nice: int) -> None:
    """Every thread of the process (Linux keeps a niceness per thread; new ones inherit it)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):  # gone meanwhile: _bury handles a dead runner
            os.setpriority(os.PRIO_PROCESS, tid, nice)


def _thread_cpu_ns(pid: int) -> int:
    """CPU time of the runner's main thread (the same clock it reads with thread_time_ns)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
        return int(f.read().split()[0])


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _describe(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"
