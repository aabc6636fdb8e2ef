"""Watching the server a harness runs on: is it still there, and a run cut short in seconds when it is not.

:class:`ServerWatch` is the base class of :class:`agentlab.runtime.harness.Harness` that holds this: it tells a
database that was dropped (:class:`~agentlab.runtime.conninfo.DatabaseMissing`) from a server that is gone or
refuses (:class:`~agentlab.runtime.conninfo.DatabaseUnavailable`) and from one that is only busy (no error);
:meth:`ServerWatch.watched` runs work beside a watchdog; :meth:`ServerWatch.restart_server` restarts the
embedded server without the watchdog counting it as gone (case C46).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from agentlab.core.tasks import pause
from agentlab.runtime.connections import is_busy
from agentlab.runtime.conninfo import (
    CONNECT_TIMEOUT_S,
    ConnectionLimitReached,
    DatabaseMissing,
    DatabaseUnavailable,
    connect_reason,
    dbname_of,
    role_limit_message,
    with_dbname,
)
from agentlab.runtime.server import restart_embedded

if TYPE_CHECKING:
    from agentlab.core.events import EventLog

T = TypeVar("T")
WATCH_INTERVAL_S = 1.0  # ServerWatch.watch_server: one connection a second, about 3 ms of the server's time


class ServerWatch:
    """The watch over one database's server. A subclass provides :attr:`url` (the database), :attr:`closed`,
    :attr:`events` (dropped rather than written once the database is gone) and :meth:`check_open`."""

    url: str
    closed: bool
    events: EventLog
    _restarts: int = 0  # restarts of the server in progress (restart_server): the watchdog lets them pass

    def check_open(self) -> None:
        """Raise when the owner was closed; the subclass says how."""
        raise NotImplementedError

    async def ensure_reachable(self, cause: BaseException | None = None) -> None:
        """Raise when this harness's database no longer takes a fresh connection (within
        :data:`~agentlab.runtime.conninfo.CONNECT_TIMEOUT_S`): a run cannot go on without it. Returns None
        when it does.

        Raises:
            agentlab.runtime.conninfo.DatabaseMissing: the server answers but the database does not exist
                (SQLSTATE 3D000: dropped, e.g. by ``await h.close()`` or ``db clean``).
            agentlab.runtime.conninfo.DatabaseUnavailable: the server is gone (it does not answer on its
                maintenance database either), or it is running and refuses the connection for another
                reason, which the message names (a server that answers "too many clients", SQLSTATE
                53300, is busy: no error).

        Once the database is unreachable, the event log drops its rows rather than wait for a connection
        at close."""
        exc = await self._probe()
        if exc is None:
            return
        if (limit := role_limit_message(exc)) is not None:  # a role limit, never "lost the server" (C53)
            raise ConnectionLimitReached(limit) from (cause or exc)
        self.events.abandon()
        reason = connect_reason(exc)
        name = dbname_of(self.url)
        exists = await self._database_exists()
        if exists is False:
            by = ("this harness was closed (`await h.close()`, a notebook's last cell, drops its database)"
                  if self.closed else "something dropped it (`python -m agentlab db clean` or `db reset`, "
                  "or another session)")
            raise DatabaseMissing(
                f"the database {name} no longer exists, though the server is running: {by}. Open a new one "
                "(re-run the notebook from its first cell, or `Harness.open()`) and run again"
            ) from (cause or exc)
        if exists:
            raise DatabaseUnavailable(
                f"the server is running but refused a new connection to {name} ({reason}); check the role "
                "and its rights (`DATABASE_URL`) and re-run"
            ) from (cause or exc)
        raise DatabaseUnavailable(
            f"lost the database server during the run ({reason}); what committed before "
            "stays, the rest was not applied. Start it again (`python -m agentlab db start`), drop what the "
            "run left (`python -m agentlab db clean`) and re-run"
        ) from (cause or exc)

    async def _database_exists(self) -> bool | None:
        """Whether the server lists this harness's database (asked on its maintenance database), or None
        when the server does not answer at all."""
        for maintenance in ("postgres", "template1"):
            try:
                conn = await psycopg.AsyncConnection.connect(with_dbname(self.url, maintenance),
                                                             connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
            except psycopg.Error as exc:
                if is_busy(exc):
                    return True  # alive; the database's own refusal is the one to report
                continue
            try:
                cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %s)",
                                         (dbname_of(self.url),))
                return bool((await cur.fetchone())[0])
            except psycopg.Error:
                return None
            finally:
                await conn.close()
        return None

    async def _probe(self) -> psycopg.Error | None:
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S)
            await conn.close()
        except psycopg.Error as exc:
            return None if is_busy(exc) else exc
        return None

    async def restart_server(self, mode: str = "fast") -> float:
        """Restart the database server this harness runs on and wait until it takes connections again; return
        the seconds it took. Every session on the server is cut, this harness's pooled connections included
        (their pools hand out none of them afterwards: :mod:`agentlab.core.pools`); :meth:`watch_server` does
        not count the server as gone meanwhile.

        Args:
            mode: ``"fast"`` or ``"immediate"`` (``pg_ctl restart -m``;
                :func:`agentlab.runtime.server.restart_embedded`).

        Raises:
            agentlab.runtime.conninfo.DatabaseUnavailable: the server is not the kit's embedded one (``DATABASE_URL``),
                or the restart failed.
        """
        self.check_open()
        self._restarts += 1
        try:
            return await asyncio.to_thread(restart_embedded, mode, url=self.url)
        finally:
            self._restarts -= 1

    @property
    def restarting(self) -> bool:
        """True while :meth:`restart_server` runs."""
        return self._restarts > 0

    async def watch_server(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Check every ``interval_s`` seconds that the server still takes a connection; never return,
        raise :class:`agentlab.runtime.conninfo.DatabaseUnavailable` once two tries in a row fail (outside a
        :meth:`restart_server` of this harness, which the watchdog waits out).

        Run it beside long work (an experiment) so a stopped server ends the run in seconds, rather
        than each episode in flight waiting out its pool timeout."""
        while True:
            await pause(interval_s)  # ends on a cancellation the pool lost (agentlab.core.tasks)
            if await self._probe() is not None and not self.restarting:
                await pause(0.2)
                if not self.restarting:
                    await self.ensure_reachable()

    async def watched(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` with :meth:`watch_server` beside it: if the server goes away first, ``coro`` is
        cancelled and :class:`agentlab.runtime.conninfo.DatabaseUnavailable` raised (within about two seconds).
        A connection error ``coro`` raises before the watchdog has seen anything (a worker process that lost
        its connection first) is checked the same way (:meth:`ensure_reachable`): a server or database that
        is gone is told as such, else the error is raised as it is."""
        work = asyncio.ensure_future(coro)
        watchdog = asyncio.ensure_future(self.watch_server())
        try:
            await asyncio.wait({work, watchdog}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                watchdog.result()  # the server is gone: raises
            try:
                return await work
            except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
                await self.ensure_reachable(exc)  # raises DatabaseUnavailable / DatabaseMissing when gone
                raise
        except BaseException:  # the server is gone, or this run was cancelled (Ctrl-C)
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise
        finally:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
