"""A TCP forwarder that adds a fixed one-way delay in each direction: a real server behind a network's round trip.

``with delay_line(host, port, one_way_delay_ms=0.25) as (line_host, line_port):`` starts a forwarder in a
process of its own (its CPU is not the caller's event loop) listening on ``line_host:line_port`` (an ephemeral
TCP port on 127.0.0.1); every connection to it is forwarded to the target, and every chunk of bytes received
at time ``t`` (in either direction) is sent on at ``t + one_way_delay_ms``: each chunk is scheduled from its own
arrival, so delays do not add up (no drift), and chunks leave in the order they came. A round trip through the
line therefore takes at least ``2 * one_way_delay_ms`` more than a direct one; it takes a little more still:
the forwarder's own two hops and the operating system's wake-up latency (tens of microseconds, more on a
loaded machine), so a bench reports the round trip it measured, not the one it asked for.

The target is ``host`` and ``port`` as libpq reads them: a ``host`` starting with ``/`` is the folder of a
Unix-domain socket (the socket is ``host/.s.PGSQL.port``), as the embedded server's URL names it (it listens
on no TCP port, ``listen_addresses = ''``); the line's own side is always TCP, so a client reaches the server
over a real TCP connection with the delay in front of it. :func:`url_target` and :func:`through` turn a
connection URL into a target and back.

Errors: :class:`DelayLineError` when the target cannot be reached when the line starts (the line checks it
with one connection, closed before anything is sent), when the forwarder does not start within
``start_timeout_s``, or when it dies. A target that fails later closes the client's connection.
The forwarder's process is ended when the ``with`` block exits, normally or by an exception, and it exits
by itself if the process that started it goes away (its stdin closes).

This module uses the standard library alone: the forwarder runs it as a script (``python -I this_file``),
without importing the package. It runs its loop on ``select()`` rather than ``epoll``: asyncio's epoll
selector rounds every timeout up to a whole millisecond, which would turn a 0.1 ms delay into 1 ms.

Sources: Python docs "Streams" (asyncio), "selectors" (``EpollSelector`` timeouts in milliseconds),
"subprocess"; Linux ``prctl(2)`` ``PR_SET_TIMERSLACK``; libpq "Connection Strings" (``host`` as a socket folder).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator

CHUNK_BYTES = 65536
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
PR_SET_TIMERSLACK = 29  # linux/prctl.h
LINE_NICE = -10  # the forwarder's scheduling priority, when it may raise it (root, CAP_SYS_NICE)


class DelayLineError(ConnectionError):
    """The delay line could not start (target unreachable, no listening port in time) or died."""


# --------------------------------------------------------------------------- the caller's side


def url_target(url: str) -> tuple[str, int]:
    """The ``(host, port)`` a libpq URL or conninfo string connects to (``host`` may be a socket folder).

    Raises:
        ValueError: the URL names several hosts (the line forwards to one).
    """
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    host = params.get("hostaddr") or params.get("host") or "localhost"
    port = str(params.get("port") or 5432)
    if "," in host or "," in port:
        raise ValueError("a delay line forwards to one server; the URL names several hosts")
    return host, int(port)


def through(url: str, host: str, port: int) -> str:
    """``url`` (a libpq URL or conninfo string) made to connect to ``host:port`` (a delay line) instead."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params.pop("hostaddr", None)
    params.update(host=host, port=str(port))
    return make_conninfo(**params)


@contextlib.contextmanager
def delay_line(target_host: str, target_port: int, *, one_way_delay_ms: float, listen_host: str = "127.0.0.1",
               start_timeout_s: float = START_TIMEOUT_S) -> Iterator[tuple[str, int]]:
    """Run a delay line to ``target_host:target_port`` for the ``with`` block; yield its ``(host, port)``.

    Args:
        target_host: a host name or address, or (starting with ``/``) the folder of a Unix-domain socket.
        target_port: the target's TCP port, or the number in the socket's name (``.s.PGSQL.<port>``).
        one_way_delay_ms: the delay added in each direction, in milliseconds (>= 0).
        listen_host: where the line listens (an ephemeral port on it).
        start_timeout_s: how long to wait for the line to listen.

    Raises:
        ValueError: a negative delay.
        DelayLineError: the target is unreachable, or the line did not start in time.
    """
    if one_way_delay_ms < 0:
        raise ValueError(f"one_way_delay_ms must be >= 0, not {one_way_delay_ms}")
    errors = tempfile.TemporaryFile()  # a file, not a pipe: a pipe nobody reads could fill and block the line
    proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), target_host, str(target_port),
                             repr(float(one_way_delay_ms)), "--listen-host", listen_host],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        ready = _first_line(proc, errors, start_timeout_s)
        if "error" in ready:
            raise DelayLineError(f"delay line to {_where(target_host, target_port)}: {ready['error']}")
        yield ready["host"], int(ready["port"])
        if proc.poll() is not None:
            raise DelayLineError(f"the delay line to {_where(target_host, target_port)} died (exit code "
                                 f"{proc.returncode}): {_last_line(errors)}")
    finally:
        _stop(proc)
        errors.close()


def _first_line(proc: subprocess.Popen, errors, timeout_s: float) -> dict:
    """The line's first line on stdout, parsed; :class:`DelayLineError` if none came within ``timeout_s``."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not lines or not lines[0].strip():
        if proc.poll() is None:
            raise DelayLineError(f"the delay line did not listen within {timeout_s:g} s")
        raise DelayLineError(f"the delay line exited at start (exit code {proc.wait()}): {_last_line(errors)}")
    return json.loads(lines[0])


def _last_line(errors) -> str:
    """The last line the line's process wrote on stderr."""
    try:
        errors.seek(0)
        text = errors.read().decode(errors="replace")
    except (OSError, ValueError):
        text = ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no message"


def _stop(proc: subprocess.Popen) -> None:
    """End the line's process and wait for it (killed if it does not stop within :data:`STOP_TIMEOUT_S`)."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(OSError):
        proc.stdout.close()


def _where(host: str, port: int) -> str:
    return _socket_path(host, port) if host.startswith("/") else f"{host}:{port}"


# --------------------------------------------------------------------------- the forwarder's process


def _socket_path(folder: str, port: int) -> str:
    return os.path.join(folder, f".s.PGSQL.{port}")


async def _open_target(host: str, port: int):
    if host.startswith("/"):
        return await asyncio.wait_for(asyncio.open_unix_connection(_socket_path(host, port)), CONNECT_TIMEOUT_S)
    return await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk sent ``delay_s`` after it arrived; end of stream passed on."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while True:
            data = await reader.read(CHUNK_BYTES)
            chunks.put_nowait((loop.time() + delay_s, data))  # due at arrival + delay: no drift, order kept
            if not data:
                return

    receiving = asyncio.create_task(receive())
    try:
        while True:
            due, data = await chunks.get()
            wait_s = due - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                await receiving
                return
            writer.write(data)
            await writer.drain()
    finally:
        receiving.cancel()
        with contextlib.suppress(BaseException):
            await receiving


async def _serve(client_reader, client_writer, host: str, port: int, delay_s: float) -> None:
    """One client connection: open the target, forward both ways until both ends are done or one fails."""
    try:
        target_reader, target_writer = await _open_target(host, port)
    except (OSError, TimeoutError) as exc:
        print(f"delay line: cannot reach {_where(host, port)}: {exc!r}", file=sys.stderr, flush=True)
        client_writer.close()
        return
    for w in (client_writer, target_writer):
        sock = w.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    tasks = [asyncio.create_task(_forward(client_reader, target_writer, delay_s)),
             asyncio.create_task(_forward(target_reader, client_writer, delay_s))]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        if pending and any(t.exception() is not None for t in done):
            for t in pending:
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for w in (client_writer, target_writer):
            w.close()


async def _run(host: str, port: int, delay_ms: float, listen_host: str) -> int:
    try:  # the target is checked once, before the line says it listens: a clear error rather than dead clients
        _, w = await _open_target(host, port)
        w.close()
    except (OSError, TimeoutError) as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {CONNECT_TIMEOUT_S:g} s"
        print(json.dumps({"error": f"cannot reach the target ({reason})"}), flush=True)
        return 2
    delay_s = delay_ms / 1000
    server = await asyncio.start_server(lambda r, w: _serve(r, w, host, port, delay_s), listen_host, 0)
    listen = server.sockets[0].getsockname()
    print(json.dumps({"host": listen[0], "port": listen[1], "one_way_delay_ms": delay_ms}), flush=True)
    async with server:
        await server.serve_forever()
    return 0


def _exit_when_parent_goes() -> None:
    """Exit when stdin closes: the process that started the line ended it, or is gone."""
    try:
        sys.stdin.buffer.read()
    finally:
        os._exit(0)


def _fine_timers() -> None:
    """Wake on time, as a network would deliver, on a machine whose cores are busy (best effort, each step
    skipped where not permitted): Linux timers without their default 50 us of slack, and the scheduler's
    priority :data:`LINE_NICE` (a network does not queue for a CPU behind the processes it serves; the line
    itself uses little: tens of microseconds a chunk)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, LINE_NICE)


def main(argv: list[str] | None = None) -> int:
    """The forwarder's process: ``python -I delay_line.py HOST PORT ONE_WAY_DELAY_MS [--listen-host H]``.

    Prints one JSON line on stdout: ``{"host", "port", "one_way_delay_ms"}`` once it listens, or
    ``{"error"}`` (exit code 2) when the target cannot be reached."""
    parser = argparse.ArgumentParser(description="a TCP forwarder with a fixed one-way delay each way")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("one_way_delay_ms", type=float)
    parser.add_argument("--listen-host", default="127.0.0.1")
    args = parser.parse_args(argv)
    threading.Thread(target=_exit_when_parent_goes, daemon=True).start()
    _fine_timers()
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())  # microsecond timeouts (epoll: milliseconds)
    try:
        return loop.run_until_complete(_run(args.host, args.port, args.one_way_delay_ms, args.listen_host))
    finally:
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
