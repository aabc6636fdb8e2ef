"""The harness's connections: one pool per role, and whether the agent role can log in.

- :func:`tools_pool`: the business pool (autocommit; the tools node opens its own transaction blocks).
- :func:`agent_pool`: the same, logged in as the least-privilege agent role itself, for the nodes of
  isolating presets (case C45); :func:`agent_login_refused` says why that login fails, as one line.
- :func:`checkpointer_pool`: the checkpointer's (``dict_row``, prepared statements off behind a
  transaction-mode pooler: case C11).

Every pool hands out live connections in their default session state (:mod:`agentlab.core.pools`, cases C44
and C46). :class:`agentlab.runtime.harness.Harness` opens one of each.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentlab.core.agent_role import AGENT_ROLE
from agentlab.core.pools import connection_pool
from agentlab.runtime.conninfo import (
    AGENT_PASSWORD_ENV,
    CONNECT_TIMEOUT_S,
    ROLE_LIMIT,
    DatabaseUnavailable,
    agent_conninfo,
    connect_reason,
)

POOL_TIMEOUT_S = 10.0  # how long a borrower waits for a connection before PoolTimeout


class AgentLoginRefused(DatabaseUnavailable):
    """Raised when a node under an isolating preset is asked for and the agent role cannot log in (not
    ``LOGIN``, no password for it, no pg_hba line); the message names the fix."""


def is_busy(exc: BaseException) -> bool:
    """True for a refused connection that says the server is alive: too many clients (SQLSTATE 53300)."""
    if ROLE_LIMIT.search(str(exc)):  # the same SQLSTATE for the role's own limit: not busy, refused (C53)
        return False
    return getattr(exc, "sqlstate", None) == "53300" or "too many clients" in str(exc)


async def agent_login_refused(url: str) -> str | None:
    """Why the agent role cannot log in to ``url``'s database with :func:`agentlab.runtime.agent_conninfo`
    (one actionable line), or None when it can (or the server is only busy: SQLSTATE 53300)."""
    try:
        conn = await psycopg.AsyncConnection.connect(agent_conninfo(url), connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        if is_busy(exc):
            return None
        reason = connect_reason(exc)
        if "not permitted to log in" in reason:
            fix = f"as a superuser run: ALTER ROLE {AGENT_ROLE} LOGIN"
        elif re.search(r"password|authentication failed", reason):
            fix = (f"give it a password (as a superuser: ALTER ROLE {AGENT_ROLE} PASSWORD '...') and put it in "
                   f"{AGENT_PASSWORD_ENV} (or in a .pgpass line for {AGENT_ROLE})")
        else:
            fix = f"let {AGENT_ROLE} connect to this database (pg_hba.conf, and a pooler's user list in front of it)"
        return (f"under an isolating preset (full) the tools log in as the least-privilege role {AGENT_ROLE} "
                f"itself, and the server refused that login ({reason}); {fix}, or run a preset without isolation")
    await conn.close()
    return None


def checkpointer_pool(url: str, *, behind_pooler: bool = False, max_size: int = 4) -> AsyncConnectionPool:
    """The checkpointer's own pool: autocommit, ``dict_row``, and no prepared statements behind a
    transaction-mode pooler (``prepare_threshold=None``), as ``AsyncPostgresSaver`` requires. It hands out
    no connection a server restart killed (:func:`agentlab.core.pools.check_alive`, case C46); no tool runs
    on it, so its session state needs no reset."""
    kwargs = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": None if behind_pooler else 0}
    return connection_pool(url, max_size=max_size, kwargs=kwargs, session_reset=False)


def tools_pool(url: str, *, behind_pooler: bool = False, max_size: int = 8,
               timeout: float = POOL_TIMEOUT_S) -> AsyncConnectionPool:
    """The pool the tools node (and the outbox worker, the event log, the run lock) borrows from: autocommit
    connections (the node opens its own transaction blocks), no prepared statements behind a transaction-mode
    pooler (case C11). Each connection comes back to the default session state whatever a tool's handler set
    (case C44) and no connection a server restart killed is handed out (case C46): see
    :mod:`agentlab.core.pools`. Behind a pooler no reset is sent (it would land on another server session)."""
    kwargs = {"autocommit": True, **({"prepare_threshold": None} if behind_pooler else {})}
    return connection_pool(url, max_size=max_size, kwargs=kwargs, timeout=timeout, session_reset=not behind_pooler)


def agent_pool(url: str, *, behind_pooler: bool = False, max_size: int = 8) -> AsyncConnectionPool:
    """The pool an isolating preset's tools node runs on (case C45): :func:`tools_pool`'s, but logged in as
    the agent role itself (:func:`agentlab.runtime.agent_conninfo`), so a handler's ``RESET ROLE`` has no
    superuser to go back to; and no connection until a batch asks for one (``min_size=0``: a run under a
    weaker preset never opens one)."""
    kwargs = {"autocommit": True, **({"prepare_threshold": None} if behind_pooler else {})}
    return connection_pool(agent_conninfo(url), min_size=0, max_size=max_size, kwargs=kwargs,
                           timeout=POOL_TIMEOUT_S, session_reset=not behind_pooler, name="agent")


def pool_for(safeguards, pool: AsyncConnectionPool, agent: AsyncConnectionPool | None,
             agent_login_refused: str | None) -> AsyncConnectionPool:
    """The pool a tools node under ``safeguards`` runs on: ``agent`` (logged in as the agent role) under
    isolation, else ``pool``. Shared by the harness and the lab's agent process.

    Raises:
        AgentLoginRefused: isolation is on and the agent role cannot log in (``agent_login_refused`` says why).
    """
    if not safeguards.isolation:
        return pool
    if agent_login_refused is not None:
        raise AgentLoginRefused(agent_login_refused)
    return agent
