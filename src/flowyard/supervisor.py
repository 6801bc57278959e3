"""``flowyard serve`` on every core: one listening socket, N API processes, one engine.

The supervisor binds the socket once and starts its children with it inherited:
``N`` API processes (``flowyard _api``: the API without the engine, all accepting
on the same socket, the kernel spreading connections) and, unless ``--no-engine``,
exactly one engine process (``flowyard worker``: worker with its runner pool,
scheduler, lifecycle reconciler, pruner). Children are told about each other's
commits through the notification channel (``flowyard.queue.notify``); all state
they share is in the database, so any child may die at any moment.

The supervisor restarts a child that died and, on SIGTERM/SIGINT, sends SIGTERM
to all of them (each drains: see ``flowyard.server`` and ``Worker.stop``) and
exits 0 once they are done; a second signal is forwarded too, so every child
exits at once. Children run in their own process group, so a terminal's Ctrl+C
reaches them only through the supervisor (once, not twice). It holds no database connection and runs no flow:
it is a plain loop over ``subprocess.Popen`` (uvicorn's own multiprocess
supervisor only knows identical API workers, not the engine beside them).

The listening socket outlives the API processes: the supervisor holds it until the
engine process is done too (running executions may take ``FLOWYARD_STOP_GRACE_SECONDS``),
and the kernel keeps completing connections on it that nobody accepts, so they would
hang until it closes and then be reset. Once the API processes stop accepting (the drain
time after the signal), the supervisor accepts instead and answers each request ``503``
with ``Retry-After`` (``DrainResponder``); it takes what is still queued before it
closes the socket.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import orjson

from flowyard import metrics
from flowyard.errors import ShuttingDown, error_body

log = logging.getLogger("flowyard.supervisor")

_FD_ENV = "FLOWYARD_LISTEN_FD"
_RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0)
_PR_SET_PDEATHSIG = 1


def bind(host: str, port: int) -> socket.socket:
    """The one listening socket every API process accepts on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def inherited_socket() -> socket.socket:
    """In an API child: the supervisor's listening socket."""
    return socket.socket(fileno=int(os.environ[_FD_ENV]))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # Linux: a SIGKILLed supervisor takes its children with it instead of orphaning them.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restarts: int = 0


def _drain_response() -> bytes:
    refusal = ShuttingDown()
    body = orjson.dumps(error_body(refusal.status, refusal.problems))
    head = [
        "HTTP/1.1 503 Service Unavailable",
        "content-type: application/json",
        f"content-length: {len(body)}",
        *(f"{name.lower()}: {value}" for name, value in refusal.headers.items()),
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass
class _Caller:
    deadline: float
    head: bytes = b""
    answered: bool = False


@dataclass
class DrainResponder:
    """Answers every connection on the listening socket ``503`` with ``Retry-After``, in the
    contract's error shape: it reads the request head (a moment at most), answers, then reads
    what else comes until the caller closes (so the answer is not lost to a reset) or the
    moment is over. Non-blocking, driven by ``poll`` from the supervisor's loop."""

    sock: socket.socket
    moment: float = 2.0
    response: bytes = field(default_factory=_drain_response)
    answered: int = 0

    def __post_init__(self) -> None:
        self.sock.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ, None)
        self.callers: dict[socket.socket, _Caller] = {}
        self.listening = True

    def poll(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.fileobj, key.data)  # type: ignore[arg-type]
        now = time.monotonic()
        for conn, caller in list(self.callers.items()):
            if now >= caller.deadline:
                if not caller.answered:
                    self._answer(conn, caller)
                self._drop(conn)

    def close(self) -> None:
        """Take what is queued, stop listening, and finish the callers taken (a moment)."""
        if self.listening:
            self._accept()
            self.selector.unregister(self.sock)
            self.sock.close()
            self.listening = False
        while self.callers:
            self.poll(0.05)
        self.selector.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # nothing queued (BlockingIOError), or the socket is gone
                return
            conn.setblocking(False)
            caller = _Caller(deadline=time.monotonic() + self.moment)
            self.callers[conn] = caller
            self.selector.register(conn, selectors.EVENT_READ, caller)

    def _read(self, conn: socket.socket, caller: _Caller) -> None:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not data:  # the caller closed (or half-closed after its request)
            if not caller.answered:
                self._answer(conn, caller)
            self._drop(conn)
        elif not caller.answered:
            caller.head = (caller.head + data)[-65536:]
            if b"\r\n\r\n" in caller.head:
                self._answer(conn, caller)

    def _answer(self, conn: socket.socket, caller: _Caller) -> None:
        caller.answered = True
        caller.deadline = time.monotonic() + self.moment  # then read the rest until the caller closes
        try:
            conn.send(self.response)  # a few hundred bytes: a fresh socket's buffer takes them
            conn.shutdown(socket.SHUT_WR)
            self.answered += 1
        except OSError:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        if self.callers.pop(conn, None) is not None:
            self.selector.unregister(conn)
        conn.close()


class Supervisor:
    def __init__(
        self, *, sock: socket.socket, api_processes: int, engine: bool, grace: float, drain: float
    ) -> None:
        self.sock = sock
        self.grace = grace
        self.drain = drain
        exe = [sys.executable, "-m", "flowyard.cli"]
        self.children = [Child(f"api-{i}", [*exe, "_api"]) for i in range(api_processes)]
        if engine:
            self.children.append(Child("engine", [*exe, "worker"]))
        self._stopping = False

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self.children:
            self._spawn(child)
        host, port = self.sock.getsockname()[:2]
        log.info(
            "serving on %s:%s with %d API processes%s",
            host,
            port,
            sum(c.name.startswith("api") for c in self.children),
            " and one engine process" if any(c.name == "engine" for c in self.children) else "",
        )
        try:
            while not self._stopping:
                self._reap_and_restart()
                time.sleep(0.2)
        finally:
            self._stop_all()
            self.sock.close()
        return 0

    def pids(self) -> dict[str, int]:
        return {c.name: c.proc.pid for c in self.children if c.proc is not None}

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._stopping:
            log.warning("second stop signal: children stop at once")
            self._signal_children()
        self._stopping = True

    def _signal_children(self) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)

    def _spawn(self, child: Child) -> None:
        fd = self.sock.fileno()
        env = {**os.environ, _FD_ENV: str(fd), "FLOWYARD_CHILD_NAME": child.name}
        env.pop("FLOWYARD_METRICS_PORT", None)  # the engine child is counted through the API's /metrics
        child.proc = subprocess.Popen(
            child.argv,
            env=env,
            pass_fds=(fd,),
            preexec_fn=_die_with_parent,
            close_fds=True,
            process_group=0,
        )
        child.started = time.monotonic()
        log.info("started %s (pid %d)", child.name, child.proc.pid)

    def _reap_and_restart(self) -> None:
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if proc is None or proc.poll() is None:
                continue
            # A child that keeps dying at once is restarted with growing pauses, not in a hot loop.
            if now - child.started > 30:
                child.failures = 0
            delay = _RESTART_BACKOFF[min(child.failures, len(_RESTART_BACKOFF) - 1)]
            if now - child.started < delay:
                continue
            log.warning("%s (pid %d) exited with %s; restarting", child.name, proc.pid, proc.returncode)
            metrics.process_dead(proc.pid)
            child.failures += 1
            child.restarts += 1
            self._spawn(child)

    def _stop_all(self) -> None:
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        self._signal_children()
        signalled = time.monotonic()
        deadline = signalled + self.drain + self.grace + 10
        responder: DrainResponder | None = None
        # A loop, not wait(): a second signal is forwarded meanwhile.
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            if responder is None and time.monotonic() >= signalled + self.drain:
                # The API processes stop accepting now: whoever connects is answered here.
                responder = DrainResponder(self.sock)
            if responder is not None:
                responder.poll(0.05)
            else:
                time.sleep(0.05)
        for proc in live:
            if proc.poll() is None:
                log.warning("pid %d did not stop in time; killing it", proc.pid)
                proc.kill()
                proc.wait()
        responder = responder or DrainResponder(self.sock)
        responder.close()
        if responder.answered:
            log.info("answered %d requests 503 while stopping", responder.answered)


def serve(*, host: str, port: int, api_processes: int, engine: bool, grace: float, drain: float) -> int:
    sock = bind(host, port)
    return Supervisor(sock=sock, api_processes=api_processes, engine=engine, grace=grace, drain=drain).run()
