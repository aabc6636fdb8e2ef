"""Database round trips, counted on the wire: a proxy every measured connection goes through, from any process.

A round trip is one turn of a connection's conversation: the server answers after the client sent something
since the server last spoke. So statements sent in one go and answered together (a psycopg pipeline up to its
sync) are one round trip however many they are, a large result in many packets is one, and a message that gets
no answer (Terminate) is none. The turns before the server's first ReadyForQuery (startup, authentication) are
counted apart as ``startup_round_trips``; that is all of the protocol the proxy reads, besides declining a
request for TLS or GSS encryption (it must see the messages in the clear).

The proxy runs on an event loop of its own, in a thread of its own: the caller's loop shows none of its tasks
(an episode that waits for the work it left running does not wait for the proxy's connections), a process that
connects through it (an agent's child process, a Temporal worker) is counted however the caller waits for it, and
the counts are read from any thread (:meth:`RoundTripCounter.snapshot`).
One episode's count is the difference of two snapshots::

    import psycopg

    async with RoundTripCounter(h.url) as counter:
        before = counter.snapshot()
        async with await psycopg.AsyncConnection.connect(counter.url(h.url), autocommit=True) as conn:
            await conn.execute("SELECT 1")
        spent = counter.snapshot() - before
    print(spent.connections, spent.query_round_trips)  # 1 1

Sources: PostgreSQL docs "Frontend/Backend Protocol" ("Message Flow", "Message Formats"); asyncio "Streams".
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentlab.runtime.conninfo import server_address

ENCRYPTION_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: the code in place of a protocol version
READY_FOR_QUERY = ord("Z")
CHUNK_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Tally:
    """What went through a :class:`RoundTripCounter`, in counts: connections accepted (a cancel request's
    included: it is a connection of its own, with no round trip), and round trips (``round_trips``
    counts every turn, the ``startup_round_trips`` of connecting and logging in among them). Subtract two
    snapshots to get one episode's: ``counter.snapshot() - before``."""

    connections: int = 0
    round_trips: int = 0
    startup_round_trips: int = 0

    @property
    def query_round_trips(self) -> int:
        """Round trips after startup: the ones statements cost."""
        return self.round_trips - self.startup_round_trips

    def __sub__(self, other: Tally) -> Tally:
        return Tally(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


class _Turns:
    """One connection's conversation: who spoke last, and whether its startup is over."""

    def __init__(self, counter: RoundTripCounter):
        self.counter, self.client_spoke, self.ready, self.head = counter, False, False, bytearray()

    def from_client(self, data: bytes) -> None:
        self.client_spoke = True

    def from_server(self, data: bytes) -> None:
        if self.client_spoke:
            self.client_spoke = False
            self.counter._count(startup=not self.ready)
        if not self.ready:  # read the server's messages (a type byte, an int32 length) up to ReadyForQuery
            self.head += data
            while len(self.head) >= 5 and not self.ready:
                self.ready = self.head[0] == READY_FOR_QUERY
                size = 1 + int.from_bytes(self.head[1:5], "big")
                if len(self.head) < size:
                    break
                del self.head[:size]


class RoundTripCounter:
    """A TCP proxy on 127.0.0.1 in front of the server of ``conninfo`` (a libpq URL or key=value string; TCP or
    a unix-socket directory as ``host``, only its first host), counting what goes through it (:class:`Tally`).

    Use it as ``async with RoundTripCounter(url) as counter:`` and connect with ``counter.url(...)``; leaving
    the block closes every connection still open through it, and waits for them. Plaintext only: the server
    must accept an unencrypted connection from this process (a unix socket or a TCP host without TLS required).

    Raises:
        ValueError: ``conninfo`` names no host (nor does ``PGHOST``).
    """

    def __init__(self, conninfo: str):
        self.target = _address(conninfo)
        self.port = 0  # the proxy's own, chosen by the OS on entering
        self._tally = Tally()  # replaced whole, only by the proxy's thread: a reader sees one consistent value
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def __aenter__(self) -> RoundTripCounter:
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentlab-roundtrips", daemon=True)
        self._thread.start()
        await self._on_proxy_loop(self._start())
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            await self._on_proxy_loop(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._loop.close()
            self._loop = self._thread = None
            self.port = 0  # url() now says the counter is not entered

    async def _on_proxy_loop(self, coro):
        """Run ``coro`` on the proxy's own event loop (its thread) and wait for it from the caller's."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()  # each closes its two sockets on the way out
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def url(self, conninfo: str) -> str:
        """``conninfo`` (any database, user, options) rewritten to reach its server through this proxy: host
        127.0.0.1, the proxy's port, ``sslmode`` and ``gssencmode`` disabled.

        Raises:
            ValueError: ``conninfo`` is for another server than the counter's, or the counter is not entered (or
                left already)."""
        if not self.port:
            raise ValueError("enter the counter first (async with RoundTripCounter(url) as counter)")
        if _address(conninfo) != self.target:
            raise ValueError("this conninfo is for another server than the one the counter stands in front of")
        params = {k: v for k, v in conninfo_to_dict(conninfo).items() if k != "hostaddr"}
        params.update(host="127.0.0.1", port=str(self.port), sslmode="disable", gssencmode="disable")
        return make_conninfo("", **params)

    def snapshot(self) -> Tally:
        """The counts so far (connections, round trips): a value, for ``counter.snapshot() - before``."""
        return self._tally

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return self._tally.connections

    @property
    def round_trips(self) -> int:
        """Round trips so far, on every connection, startup included."""
        return self._tally.round_trips

    @property
    def startup_round_trips(self) -> int:
        """The part of :attr:`round_trips` spent connecting and logging in."""
        return self._tally.startup_round_trips

    def _count(self, startup: bool) -> None:
        t = self._tally
        self._tally = dataclasses.replace(t, round_trips=t.round_trips + 1,
                                          startup_round_trips=t.startup_round_trips + startup)

    def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """Called as a connection is accepted: its task is known at once, so leaving the block can cancel it."""
        if self._closing:
            client_w.transport.abort()
            return
        self._tally = dataclasses.replace(self._tally, connections=self._tally.connections + 1)
        task = asyncio.get_running_loop().create_task(self._serve(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        turns, writers = _Turns(self), [client_w]
        try:
            first = await client_r.readexactly(8)  # a StartupMessage, CancelRequest or encryption request
            while int.from_bytes(first[4:8], "big") in ENCRYPTION_REQUESTS:
                client_w.write(b"N")  # declined: the client goes on in the clear (or gives up, if it must not)
                first = await client_r.readexactly(8)
            host, port = self.target
            if host.startswith("/"):
                server_r, server_w = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
            else:
                server_r, server_w = await asyncio.open_connection(host, int(port))
            writers.append(server_w)
            turns.from_client(first)
            server_w.write(first)
            await asyncio.gather(_pump(client_r, server_w, turns.from_client),
                                 _pump(server_r, client_w, turns.from_server))
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client left before its startup, or the server cannot be reached: the client sees EOF
        finally:
            for writer in writers:
                writer.close()
            for writer in writers:
                try:
                    await writer.wait_closed()
                except OSError:
                    pass


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen) -> None:
    """Copy ``reader`` to ``writer``, calling ``seen(data)`` before each chunk goes on, until either side ends;
    then close ``writer``, which ends the other direction's pump too (its reader sees EOF)."""
    try:
        while data := await reader.read(CHUNK_BYTES):
            seen(data)
            writer.write(data)
            await writer.drain()
    except OSError:
        pass  # reset or broken pipe: the connection is over either way
    finally:
        writer.close()


def _address(conninfo: str) -> tuple[str, str]:
    """(host or socket directory, port) of ``conninfo``'s first host, ``PGHOST`` / ``PGPORT`` filling gaps."""
    host, port = server_address(conninfo)
    host = conninfo_to_dict(conninfo).get("hostaddr") or host
    if not conninfo_to_dict(conninfo).get("port"):
        port = os.environ.get("PGPORT") or port
    host = (host or os.environ.get("PGHOST") or "").split(",")[0]
    if not host:
        raise ValueError("the conninfo names no host (and PGHOST is unset): name the server to count round trips to")
    return host, port.split(",")[0]
