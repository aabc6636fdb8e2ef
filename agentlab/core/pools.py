"""Pooled connections: every borrower gets a live connection in its default session state.

The kit's pools are psycopg_pool ``AsyncConnectionPool`` objects built by :func:`connection_pool`, which
hands psycopg_pool two callbacks:

- ``reset`` (:func:`reset_session`, run by the pool's worker after each return): a tool handler runs on
  the batch's connection and may leave session state behind. A plain ``SET search_path TO lax, public``
  (or ``SET ROLE``, ``SET statement_timeout = 0``) inside a transaction that commits outlives it, and the
  next batch on that connection, on any thread and under any preset, would write where the handler
  pointed it: to the unconstrained ``lax`` copy (case C44). A temporary table named like a business
  table shadows it (``pg_temp`` comes first in every search path); a session advisory lock, a ``LISTEN``
  or a cursor ``WITH HOLD`` stays too. :data:`RESET_SESSION` undoes all of them in one round trip;
- ``check`` (:func:`check_alive`, run before each hand-out): a server restart (``pg_ctl restart``) ends
  every backend, and each idle connection of a pool is dead from then on; a pool without a check hands
  them out one by one, and a run whose batch committed fails on its checkpoint write, a drain on its
  first claim (case C46). The check costs no round trip while the connection's socket is quiet; a
  socket with something to read (the server's last words before it closed the connection, or the
  close itself) is checked with psycopg_pool's own ``check_connection``. When that fails, the pool's
  other idle connections are checked at once (``pool.check()``): after a restart they are all dead,
  and psycopg_pool would otherwise back off a second, then two, between one dead connection and the next.

Why not ``DISCARD ALL``: it also runs ``DEALLOCATE ALL``, dropping the statements psycopg prepared on the
connection (after ``prepare_threshold`` executions) while psycopg's cache still names them: the next
execution of one is refused with SQLSTATE 26000 (see :mod:`agentlab.core.prepared`). :data:`RESET_SESSION`
is ``DISCARD ALL`` without ``DEALLOCATE ALL`` and ``DISCARD PLANS`` (PostgreSQL re-plans a cached
statement itself when the search path changes), so the kit's prepared statements stay valid and keep
their benefit.

Behind a transaction-mode pooler (PgBouncer) the client's connection is not one server session: a reset
sent through it lands on whichever server session serves it, and ``pg_advisory_unlock_all()`` there
could release another client's lock. Pools built with ``session_reset=False`` (the kit's, behind a
pooler) send none; the pooler's own ``server_reset_query`` is the place for it there.

Sources: psycopg docs "Connection pools" (``check``, ``reset``, ``check_connection``, "Connection
quality"), "Prepared statements"; PostgreSQL docs "DISCARD", "RESET", "SET SESSION AUTHORIZATION",
"Advisory Locks", "Schemas: The Schema Search Path" (``pg_temp`` first).
"""

from __future__ import annotations

import logging
import select
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, AsyncNullConnectionPool

from agentlab.core import budget

log = logging.getLogger(__name__)

# DISCARD ALL without DEALLOCATE ALL and DISCARD PLANS (see the module's docstring). The session's login
# role comes back first, so RESET ALL runs with the rights it connected with.
RESET_SESSION = (
    "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; RESET ALL; CLOSE ALL; UNLISTEN *;"
    " SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES"
)


async def reset_session(conn: psycopg.AsyncConnection) -> None:
    """psycopg_pool's ``reset``: bring ``conn`` back to the session state it had when it connected
    (:data:`RESET_SESSION`, one round trip; sent with ``prepare=False``: psycopg cannot prepare several
    statements as one). Raises what psycopg raises; the pool then discards ``conn``."""
    await conn.execute(RESET_SESSION, prepare=False)


def socket_quiet(conn: psycopg.AsyncConnection) -> bool:
    """True when ``conn``'s socket has nothing to read: an idle connection the server has not written to
    since its last answer. A server that ends the backend (a restart, ``pg_terminate_backend``) writes its
    reason and closes the socket, both of which make it readable. No round trip, no blocking."""
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):  # no socket any more
        return False
    return not readable


async def check_alive(conn: psycopg.AsyncConnection) -> None:
    """psycopg_pool's ``check``: return when ``conn`` may be handed out, raise when it is dead.

    A connection whose socket is quiet (:func:`socket_quiet`) is handed out without a round trip; any
    other is asked by ``AsyncConnectionPool.check_connection`` (an empty query).

    Raises:
        psycopg.OperationalError: ``conn`` is closed or broken, or the server does not answer on it.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    if socket_quiet(conn):
        return
    await AsyncConnectionPool.check_connection(conn)


def connection_pool(url: str, *, min_size: int = 1, max_size: int = 4, kwargs: dict[str, Any] | None = None,
                    timeout: float = 30.0, session_reset: bool = True, name: str | None = None) -> AsyncConnectionPool:
    """An ``AsyncConnectionPool`` on ``url`` (not opened: ``await pool.open(wait=True)``) with the kit's
    ``check`` (:func:`check_alive`; on a dead connection the pool's other idle ones are checked too) and,
    with ``session_reset``, its ``reset`` (:func:`reset_session`).

    Args:
        url: the conninfo or URL.
        min_size, max_size: the pool's bounds (connections).
        kwargs: passed to each ``psycopg.AsyncConnection.connect`` (``autocommit``, ``row_factory``, ...).
        timeout: seconds a borrower waits for a connection before ``psycopg_pool.PoolTimeout``.
        session_reset: reset each returned connection's session state; False behind a transaction-mode pooler.
        name: the pool's name in psycopg_pool's log.
    """
    pool: AsyncConnectionPool | None = None

    async def check(conn: psycopg.AsyncConnection) -> None:
        try:
            await check_alive(conn)
        except psycopg.Error:
            if pool is not None:  # the other idle connections of a restarted server are dead too
                log.info("a pooled connection was dead; checking the pool's other idle connections")
                await pool.check()
            raise

    options = {"kwargs": kwargs, "timeout": timeout, "open": False, "check": check,
               "reset": reset_session if session_reset else None, "name": name}
    if budget.pooled_slots() is not None:  # AGENTLAB_MAX_CONNECTIONS: nothing idle, every connection through the gate
        pool = AsyncNullConnectionPool(url, min_size=0, max_size=min(max_size, budget.pooled_slots()),
                                       connection_class=budget.BudgetedConnection, **options)
    else:
        pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, **options)
    return pool
