"""Who may commit for a saga run: the session advisory lock that refuses a second runner early, and the
fenced transaction that commits only while the run row still names this runner's owner token
(:class:`agentlab.durable.saga.SagaRunner` claims a run with a fresh token, then writes through these).

No correctness rests on the session lock: a session can be terminated, and behind a transaction-mode
pooler (PgBouncer ``pool_mode = transaction``) it lands on whichever server session the pooler lent, so
there none is taken (``behind_pooler=True``). The fencing token does the work: each committing transaction
first locks the run row (``FOR NO KEY UPDATE``) and checks the token, the status and the direction; a
runner that lost the run gets :class:`agentlab.durable.saga_model.SagaFenced` and its transaction rolls back.
``fencing=False`` is the failure lab's weaker setting (case C32): nothing is checked.

Sources: PostgreSQL docs "Advisory Locks", "Row-Level Locks"; M. Kleppmann, "How to do distributed
locking" (fencing tokens).
"""

from __future__ import annotations

import contextlib
import logging

import psycopg

from agentlab.durable import saga_sql as q
from agentlab.durable.saga_model import RunStatus, SagaBusy, SagaFenced

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def fenced_transaction(pool, run: dict, status: RunStatus | None, direction: str | None, *,
                             lock_timeout_ms: int, statement_timeout_ms: int, fencing: bool = True):
    """A transaction that may commit for this run: it locks the run row first and goes on only if
    the row still names this runner's owner token (and, when given, this status and direction).

    ``run`` is the runner's view of the run (``id``, and ``token``: the owner token it claimed);
    ``lock_timeout_ms`` / ``statement_timeout_ms`` are set with ``SET LOCAL`` (milliseconds). Yields the
    connection, inside the transaction.

    Raises:
        SagaFenced: the run was claimed by another runner or moved on; the transaction rolls back.
    """
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(q.SET_LOCAL_TIMEOUTS, (f"{lock_timeout_ms}ms", f"{statement_timeout_ms}ms"))
        if not fencing:  # the weaker setting: nothing checked, whoever runs commits
            yield conn
            return
        now_status, now_direction, owner = await (await conn.execute(q.LOCK_RUN, (run["id"],))).fetchone()
        if owner != run["token"]:
            raise SagaFenced(q.FENCED_OWNER.format(run_id=run["id"]))
        if (status is not None and now_status != status.value) or (
                direction is not None and now_direction != direction):
            raise SagaFenced(q.FENCED_STATE.format(run_id=run["id"], status=now_status, direction=now_direction,
                                                 expected=status.value if status else "any status",
                                                 expected_direction=direction or "any direction"))
        yield conn


@contextlib.asynccontextmanager
async def session_lock(pool, run_id: int, *, behind_pooler: bool = False):
    """Hold the run's session advisory lock on a connection of its own while the runner works (none
    behind a transaction-mode pooler, where a session lock lands on a shared server session).

    Raises:
        SagaBusy: another session holds the run's lock.
    """
    if behind_pooler:
        yield
        return
    async with pool.connection() as conn:
        if not (await (await conn.execute(q.RUN_LOCK, (run_id,))).fetchone())[0]:
            raise SagaBusy(f"saga run {run_id} is being run by another runner")
        try:
            yield
        finally:
            try:
                await conn.execute(q.RUN_UNLOCK, (run_id,))
            except psycopg.Error:  # a broken connection is discarded by the pool, its lock with it
                log.info("could not unlock saga run %s; its connection is gone", run_id)
