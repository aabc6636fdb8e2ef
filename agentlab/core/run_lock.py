"""One writer per thread for a whole run: a lease row with an owner token (case C18).

The advisory lock of the tools node (``pg_advisory_xact_lock`` on the thread) serializes *batches*:
two runs started on one thread at once (a double submit, a retried HTTP request, two tabs) still
interleave their batches, both act on the request and both write checkpoints, so the thread's
checkpoint chain forks (langgraph#8796). The unit that must be exclusive is the run.

The rule (the same as for saga runs, issue 17): exclusivity the kit relies on is held *in the
transaction that commits the effect*, never by a session-level lock on an idle pooled connection
(behind a transaction-mode pooler, or after a killed backend, such a lock silently belongs to nobody).
So a run holds a row:

1. at its start, :func:`acquire_lease` inserts ``runs.thread_leases (thread_id, owner_token, expires_at)``,
   or takes over a row whose lease has expired, in one short transaction that never waits for a batch:
   it first locks the thread's row with ``FOR UPDATE NOWAIT`` (:data:`LOCK_LEASE_NOWAIT`), then sends the
   ``INSERT ... ON CONFLICT`` (:data:`ACQUIRE_LEASE`), pipelined with BEGIN and COMMIT (one round trip);
2. every batch of the run renews the lease *inside the batch transaction*, as its first statement
   (:data:`RENEW_LEASE`, sent by :class:`agentlab.core.tools_node.TransactionalToolsNode` when the graph
   config carries the run's token, :data:`RUN_TOKEN_KEY`): the row is locked until COMMIT, and zero rows
   (another run took the thread over after this one's lease expired) roll the batch back with
   :class:`LeaseLost` before any tool SQL ran;
3. at its end (success, error or cancellation) :func:`release_lease` deletes the row, matching the token.

A second run on a busy thread **is refused** with :class:`ThreadBusy` after waiting at most ``wait_ms``
for the first to end (default 0: refused at once, as LangGraph Platform's ``multitask_strategy="reject"``);
it never runs beside the first one. The thread is busy when its row carries another run's live lease, or
when the row is locked (SQLSTATE 55P03 ``lock_not_available`` from ``NOWAIT``): a batch of the run that
holds it is between its RENEW_LEASE and its COMMIT. Without ``NOWAIT`` the ``INSERT ... ON CONFLICT``
would wait for that batch's COMMIT, and if the first run ended and deleted its row meanwhile, the second
would insert a row of its own and follow the first instead of being refused: the outcome of ``wait_ms=0``
would depend on timing. The wait of ``wait_ms`` is a client-side poll every :data:`POLL_MS` ms, never a
wait on a lock (a ``lock_timeout`` would make the refusal depend on how long the batch takes). When the
thread has no row yet, two acquisitions at the same instant meet in the INSERT's unique index: the later
waits for the earlier's transaction (no batch inside it, one round trip) and then finds its live lease.
A run whose process died leaves its row until ``expires_at``; a resume of *that* run (the same token:
the lab's restarted process, a job runner that recorded it) continues under it, any other run waits for
the expiry.

Behind a transaction-mode pooler (PgBouncer ``pool_mode = transaction``) the lease holds as on the server:
each of its statements is in a transaction of its own (the acquisition's, the release's, the batch's),
so whichever server session the pooler lends, every client reads and writes the same row
(``tests/test_c18_lease_behind_pgbouncer.py``).

What the lease does not cover: the checkpoint writes themselves run on the saver's own connections,
outside any batch. They belong to the run that holds the lease as long as its lease is live (each batch
renews it for ``ttl_ms``); a run stalled past its lease and taken over stops at its next batch.

Sources: PostgreSQL docs "INSERT ... ON CONFLICT", "Explicit Locking" (row-level locks), "SELECT: The
Locking Clause" (``NOWAIT``), Appendix A (SQLSTATE 55P03), "Pipeline Mode" (libpq); Kleppmann,
"How to do distributed locking" (fencing tokens); LangGraph Platform "Double texting" (reject / enqueue).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psycopg

from agentlab.core.errors import AgentlabError

RUN_TOKEN_KEY = "__agentlab_run_token"  # in config["configurable"]; "__" keeps it out of checkpoint metadata
DEFAULT_TTL_MS = 60_000
POLL_MS = 20

# The acquisition's first statement: lock the thread's row if there is one, or fail at once (SQLSTATE 55P03)
# when a batch of the run holding it has it locked (RENEW_LEASE .. COMMIT); the INSERT after it never waits.
LOCK_LEASE_NOWAIT = "SELECT owner_token FROM runs.thread_leases WHERE thread_id = %(thread)s FOR UPDATE NOWAIT"
# Insert the lease, or take over an expired one (or our own: a resume of the same run). Zero rows: busy.
ACQUIRE_LEASE = """
INSERT INTO runs.thread_leases AS t (thread_id, owner_token, expires_at)
VALUES (%(thread)s, %(owner)s, clock_timestamp() + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (thread_id) DO UPDATE
    SET owner_token = EXCLUDED.owner_token, expires_at = EXCLUDED.expires_at, acquired_at = now()
    WHERE t.expires_at < clock_timestamp() OR t.owner_token = EXCLUDED.owner_token
RETURNING owner_token
"""
# The first statement of each batch of a leased run: locks the row until COMMIT; zero rows = lease lost.
RENEW_LEASE = """
UPDATE runs.thread_leases SET expires_at = clock_timestamp() + %s * interval '1 millisecond'
WHERE thread_id = %s AND owner_token = %s
RETURNING owner_token
"""
RELEASE_LEASE = "DELETE FROM runs.thread_leases WHERE thread_id = %s AND owner_token = %s"
LEASE_HOLDER = "SELECT owner_token, expires_at > clock_timestamp() FROM runs.thread_leases WHERE thread_id = %s"


class ThreadBusy(AgentlabError):
    """Raised when a run starts on a thread whose lease another run holds (after waiting ``wait_ms``);
    nothing of the refused run was sent to the thread."""


class LeaseLost(AgentlabError):
    """Raised inside a batch when its run no longer holds the thread's lease (it expired and another run
    took the thread over); the batch is rolled back before any tool SQL ran."""


@dataclass(frozen=True)
class ThreadLease:
    """A held lease: the thread, the owner token (put it in the run's config: :meth:`configure`), the TTL."""

    thread_id: str
    owner_token: str
    ttl_ms: int = DEFAULT_TTL_MS
    waited_ms: float = 0.0

    def configure(self, config: dict) -> dict:
        """``config`` (a RunnableConfig) with this lease's token in ``configurable``, so every batch of the
        run renews the lease inside its own transaction. A new dict; ``config`` is not changed."""
        conf = {**config.get("configurable", {}), RUN_TOKEN_KEY: self.owner_token}
        return {**config, "configurable": conf}


def run_token(config: dict | None) -> str | None:
    """The run token a graph config carries (:data:`RUN_TOKEN_KEY`), or None."""
    token = ((config or {}).get("configurable") or {}).get(RUN_TOKEN_KEY)
    return token if isinstance(token, str) and token else None


async def acquire_lease(pool, thread_id: str, *, owner_token: str | None = None, ttl_ms: int = DEFAULT_TTL_MS,
                        wait_ms: int = 0) -> ThreadLease:
    """Take the lease of ``thread_id`` for one run.

    Args:
        pool: an ``AsyncConnectionPool`` of autocommit connections on the kit's database.
        owner_token: the run's token (a new UUID when None); the same token re-acquires its own lease
            (a resume of the same run after its process died).
        ttl_ms: how long the lease lives without a batch renewing it (milliseconds).
        wait_ms: how long to wait for a busy thread's run to end before refusing (milliseconds; 0: refuse
            at once). The wait polls every :data:`POLL_MS` ms; it never holds a connection while waiting,
            and no attempt waits for a lock (a batch of the running run holding the row counts as busy).

    Raises:
        ThreadBusy: another run holds the thread's lease (its token is not shown).
        ValueError: ``ttl_ms`` below 1 or ``wait_ms`` below 0.
    """
    if ttl_ms < 1 or wait_ms < 0:
        raise ValueError("ttl_ms must be at least 1 and wait_ms at least 0 (milliseconds)")
    owner = owner_token or str(uuid.uuid4())
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + wait_ms / 1000
    while True:
        async with pool.connection() as conn:
            taken = await _try_acquire(conn, {"thread": thread_id, "owner": owner, "ttl_ms": ttl_ms})
        if taken:
            return ThreadLease(thread_id, owner, ttl_ms, (loop.time() - start) * 1000)
        if loop.time() >= deadline:
            raise ThreadBusy(
                f"thread {thread_id!r} has a run in progress; this run was refused after waiting {wait_ms} ms "
                "(one writer per thread): send it again once that run has ended, or use another thread")
        await asyncio.sleep(min(POLL_MS / 1000, max(0.0, deadline - loop.time())))


async def _try_acquire(conn, params: dict) -> bool:
    """One attempt on an autocommit connection: BEGIN, :data:`LOCK_LEASE_NOWAIT`, :data:`ACQUIRE_LEASE`,
    COMMIT, pipelined (one round trip). True when the lease was taken; False when the thread is busy: its
    row is locked by a batch (55P03; the failed transaction is rolled back, a second round trip) or the
    INSERT's ``WHERE`` kept another run's live lease (zero rows)."""
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            await conn.execute(LOCK_LEASE_NOWAIT, params)
            cur = await conn.execute(ACQUIRE_LEASE, params)
            await conn.execute("COMMIT")
    except psycopg.errors.LockNotAvailable:
        await conn.execute("ROLLBACK")
        return False
    return await cur.fetchone() is not None


async def release_lease(pool, lease: ThreadLease) -> bool:
    """Delete ``lease``'s row (only if it still carries its token); True when it did."""
    async with pool.connection() as conn:
        cur = await conn.execute(RELEASE_LEASE, (lease.thread_id, lease.owner_token))
        return cur.rowcount == 1


@contextlib.asynccontextmanager
async def thread_lease(pool, thread_id: str, **kwargs) -> AsyncIterator[ThreadLease]:
    """``async with thread_lease(pool, thread_id) as lease:`` holds the thread for one run and releases it
    at the end, whatever happened; pass ``lease.configure(config)`` to the graph. Arguments and errors as
    :func:`acquire_lease`."""
    lease = await acquire_lease(pool, thread_id, **kwargs)
    try:
        yield lease
    finally:
        with contextlib.suppress(Exception):  # a lost database: the lease expires on its own
            await asyncio.shield(release_lease(pool, lease))


async def invoke_with_lease(graph, pool, input, config: dict, *, wait_ms: int = 0, ttl_ms: int = DEFAULT_TTL_MS,
                            owner_token: str | None = None, **invoke_kwargs):
    """``graph.ainvoke(input, config)`` as one run holding ``config``'s thread: the lease is taken before the
    run starts and released when it ends; every batch renews it in its own transaction.

    Raises:
        ThreadBusy: another run holds the thread (after ``wait_ms``); the graph was not invoked.
        Exception: whatever the run raises (the lease is released first).
    """
    thread_id = str(config.get("configurable", {}).get("thread_id", "default"))
    async with thread_lease(pool, thread_id, owner_token=owner_token, ttl_ms=ttl_ms, wait_ms=wait_ms) as lease:
        return await graph.ainvoke(input, lease.configure(config), **invoke_kwargs)
