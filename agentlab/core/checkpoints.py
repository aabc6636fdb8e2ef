"""The checkpointer: LangGraph's ``AsyncPostgresSaver``, each of its calls retried across a lost connection.

The business commit and the checkpoint write are two transactions; the ledger covers the window between
them. A server restart (``pg_ctl restart``) in that window cuts the checkpoint write's connection, and
LangGraph does not retry a checkpoint write: the run raises although its batch committed. Under
``durability="async"`` (the harness's default) the write of one super-step runs while the next node works,
so a restart the tools node meets cuts that write too (case C46).

Every write of the saver is idempotent by construction: ``INSERT ... ON CONFLICT`` on the checkpoint's id,
on each blob's channel and version, on each pending write's task and index. So :class:`RetryingSaver`
runs a write again when it lost its connection, on another connection from the pool (whose check hands
out no connection the restart killed: :mod:`agentlab.core.pools`); a write that had committed before its
answer was lost is written again with the same values. Reads (``aget_tuple``) are retried the same way.
Only a lost connection is retried (:func:`connection_lost`), at most :data:`ATTEMPTS` times in all, after
the pauses of :data:`BACKOFF_S`; any other error is raised at once, as is the last attempt's.

Sources: langgraph-checkpoint-postgres ``AsyncPostgresSaver`` (its SQL constants, ``ON CONFLICT``);
LangGraph docs "Persistence" (durability modes); PostgreSQL Appendix A (classes 08 and 57).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg_pool import PoolClosed, PoolTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")
ATTEMPTS = 4  # the first try and three more
BACKOFF_S = (0.1, 0.5, 1.0)  # seconds before the second, third and fourth try


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the connection (or the server behind it) went away: a
    ``psycopg.OperationalError`` (SQLSTATE classes 08 and 57: ``AdminShutdown`` on a restart,
    ``CannotConnectNow`` while the server starts), never the pool's own ``PoolTimeout`` or ``PoolClosed``
    (the pool already waited its full timeout, or is closed: trying again does not help)."""
    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, (PoolTimeout, PoolClosed))


async def retried(call: Callable[[], Awaitable[T]], what: str) -> T:
    """``await call()``, again after each lost connection (:func:`connection_lost`), at most
    :data:`ATTEMPTS` times in all. Raises the last attempt's error, and any other error at once."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == ATTEMPTS or not connection_lost(exc):
                raise
            log.warning("checkpointer %s lost its connection (%s: %s); trying again (attempt %d of %d)", what,
                        type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "", attempt + 1,
                        ATTEMPTS)
            await asyncio.sleep(BACKOFF_S[attempt - 1])
    raise AssertionError("unreachable")  # pragma: no cover


class RetryingSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` whose writes (``aput``, ``aput_writes``) and reads (``aget_tuple``) are tried again
    after a lost connection (see the module's docstring). Built as the saver is: ``RetryingSaver(conn=pool)``."""

    async def aget_tuple(self, config) -> Any:
        return await retried(lambda: super(RetryingSaver, self).aget_tuple(config), "read")

    async def aput(self, config, checkpoint, metadata, new_versions) -> Any:
        return await retried(lambda: super(RetryingSaver, self).aput(config, checkpoint, metadata, new_versions),
                             "write")

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        return await retried(lambda: super(RetryingSaver, self).aput_writes(config, writes, task_id, task_path),
                             "write")
