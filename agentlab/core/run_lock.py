"""One writer per thread for a whole run: a lease row with an owner token (case C18).

The advisory lock of the tools node (``pg_advisory_xact_lock`` on the thread) serializes *batches*:
two runs started on one thread at once (a double submit, a retried HTTP request, two tabs) still
interleave their batches, both act on the request and both write checkpoints, so the thread's
checkpoint chain forks (langgraph#8796). The unit that must be exclusive is the run.

The rule (the same as for saga runs, issue 17): exclusivity the kit relies on is held *in the
transaction that commits the effect*, never by a session-level lock on an idle pooled connection
(behind a transaction-mode pooler, or after a killed backend, such a lock silently belongs to nobody).
So a run holds a row:

1. at its start, :func:`acquire_lease` inserts ``runs.thread_leases (thread_id, owner_token, expires_at, ttl_ms)``,
   or takes over a row whose lease has expired, in one short transaction that never waits for a batch:
   it first locks the thread's row with ``FOR UPDATE NOWAIT`` (:data:`LOCK_LEASE_NOWAIT`), then sends the
   ``INSERT ... ON CONFLICT`` (:data:`ACQUIRE_LEASE`), pipelined with BEGIN and COMMIT (one round trip);
2. every batch of the run renews the lease *inside the batch transaction*, as its first statement
   (:data:`RENEW_LEASE`, sent by :class:`agentlab.core.batch.TransactionalToolsNode` when the graph
   config carries the run's token, :data:`RUN_TOKEN_KEY`): the row is locked until COMMIT, and zero rows
   (another run took the thread over after this one's lease expired) roll the batch back with
   :class:`LeaseLost` before any tool SQL ran. A renewal extends the lease by the lease's own ``ttl_ms``
   (at most the node's ``lease_ttl_ms``);
3. at its end (success, error or cancellation) :func:`release_lease` deletes the row, matching the token.

Who takes it: the kit's entry points (:func:`invoke_with_lease`, ``Harness.run_episode``) before the run,
and the compiled graph itself for any other caller (:class:`agentlab.core.leased_graph.LeasedGraph`, case
C41: a plain ``graph.ainvoke``, ``astream``, a resume with ``Command``). The graph's own lease is short
(:data:`HEARTBEAT_TTL_MS`) and kept alive while the run lives by :func:`keep_alive`, so a run whose process
died frees its thread within seconds; the next plain call waits that out (``outlast_ms``) instead of being
refused, and is refused as soon as the holder shows it is alive (it renewed its lease meanwhile).

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
the expiry. Nothing of a LangGraph invocation survives a resume but the thread and its checkpoints (its
``run_id`` is the caller's, None unless given, and new on every call), so a plain resume is a new run.

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
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psycopg

from agentlab.core.errors import AgentlabError
from agentlab.core.prepared import forget_prepared
from agentlab.core.tasks import pause

log = logging.getLogger(__name__)

RUN_TOKEN_KEY = "__agentlab_run_token"  # in config["configurable"]; "__" keeps it out of checkpoint metadata
DEFAULT_TTL_MS = 60_000
POLL_MS = 20
HEARTBEAT_TTL_MS = 5_000  # the TTL of a lease kept alive by keep_alive: a crashed run frees its thread within it
HEARTBEAT_INTERVAL_MS = 1_000  # how often keep_alive renews it (a live holder is seen renewing within this)

# The acquisition's first statement: lock the thread's row if there is one, or fail at once (SQLSTATE 55P03)
# when a batch of the run holding it has it locked (RENEW_LEASE .. COMMIT); the INSERT after it never waits.
LOCK_LEASE_NOWAIT = "SELECT owner_token FROM runs.thread_leases WHERE thread_id = %(thread)s FOR UPDATE NOWAIT"
# Insert the lease, or take over an expired one (or our own: a resume of the same run). Zero rows: busy.
ACQUIRE_LEASE = """
INSERT INTO runs.thread_leases AS t (thread_id, owner_token, expires_at, ttl_ms)
VALUES (%(thread)s, %(owner)s, clock_timestamp() + %(ttl_ms)s * interval '1 millisecond', %(ttl_ms)s)
ON CONFLICT (thread_id) DO UPDATE
    SET owner_token = EXCLUDED.owner_token, expires_at = EXCLUDED.expires_at, ttl_ms = EXCLUDED.ttl_ms,
        acquired_at = now()
    WHERE t.expires_at < clock_timestamp() OR t.owner_token = EXCLUDED.owner_token
RETURNING owner_token
"""
# The first statement of each batch of a leased run: locks the row until COMMIT; zero rows = lease lost.
# The parameters: the node's TTL (a lease renews by its own when shorter: a heartbeated one, C41), thread,
# token. Through a SECURITY DEFINER function, runs.renew_lease (the core's migrations): under isolation the
# batch's connection is the agent role's own login (C45), which may not touch runs.thread_leases; the
# function renews a lease whose token it is given, and shows no other.
RENEW_LEASE = "SELECT owner_token FROM runs.renew_lease(%s, %s, %s) AS owner_token"
# keep_alive's renewal, outside any batch: skips a row a batch of the same run has locked (it renews it itself).
HEARTBEAT_LEASE = """
UPDATE runs.thread_leases AS t SET expires_at = clock_timestamp() + t.ttl_ms * interval '1 millisecond'
FROM (SELECT thread_id FROM runs.thread_leases WHERE thread_id = %(thread)s AND owner_token = %(owner)s
      FOR UPDATE SKIP LOCKED) AS mine
WHERE t.thread_id = mine.thread_id
"""
# What a waiting run watches: a holder whose stamp changes is alive (it renewed, or another run took over).
LEASE_STAMP = """
SELECT owner_token, expires_at, 1000 * extract(epoch FROM expires_at - clock_timestamp()) AS left_ms
FROM runs.thread_leases WHERE thread_id = %s
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
                        wait_ms: int = 0, outlast_ms: int = 0) -> ThreadLease:
    """Take the lease of ``thread_id`` for one run.

    Args:
        pool: an ``AsyncConnectionPool`` of autocommit connections on the kit's database.
        owner_token: the run's token (a new UUID when None); the same token re-acquires its own lease
            (a resume of the same run after its process died).
        ttl_ms: how long the lease lives past its last renewal (milliseconds).
        wait_ms: how long to wait for a busy thread's run to end before refusing (milliseconds; 0: refuse
            at once). The wait polls every :data:`POLL_MS` ms; it never holds a connection while waiting,
            and no attempt waits for a lock (a batch of the running run holding the row counts as busy).
        outlast_ms: for holders that keep their lease alive (:func:`keep_alive`): a holder whose lease ends
            within this many milliseconds and that does not renew it while this run waits is taken for a
            run whose process died, and waited out until its lease expires (then taken over) instead of
            refused; one that renews it is alive, and this run is refused once ``wait_ms`` has passed.
            0: every holder counts as alive.

    Raises:
        ThreadBusy: another run holds the thread's lease (its token is not shown).
        ValueError: ``ttl_ms`` below 1, ``wait_ms`` or ``outlast_ms`` below 0.
    """
    if ttl_ms < 1 or wait_ms < 0 or outlast_ms < 0:
        raise ValueError("ttl_ms must be at least 1, wait_ms and outlast_ms at least 0 (milliseconds)")
    owner = owner_token or str(uuid.uuid4())
    params = {"thread": thread_id, "owner": owner, "ttl_ms": ttl_ms}
    loop = asyncio.get_running_loop()
    start = loop.time()
    first_stamp, alive = None, False
    while True:
        stamp = None
        async with pool.connection() as conn:
            taken = await _try_acquire(conn, params)
            if not taken and outlast_ms:
                stamp = await (await conn.execute(LEASE_STAMP, (thread_id,))).fetchone()
        waited_ms = (loop.time() - start) * 1000
        if taken:
            return ThreadLease(thread_id, owner, ttl_ms, waited_ms)
        if stamp is not None:
            first_stamp = first_stamp or stamp[:2]
            alive = alive or stamp[:2] != first_stamp
        dying = stamp is not None and not alive and stamp[2] <= outlast_ms
        if waited_ms >= wait_ms and not dying and (stamp is not None or not outlast_ms):
            shown = round(waited_ms) if outlast_ms else wait_ms
            raise ThreadBusy(
                f"thread {thread_id!r} has a run in progress; this run was refused after waiting {shown} ms "
                "(one writer per thread): send it again once that run has ended, or use another thread")
        if stamp is None and outlast_ms:
            continue  # the holder let go between the attempt and the look: try again at once
        pause_s = POLL_MS / 1000 if dying else min(POLL_MS, max(0.0, wait_ms - waited_ms)) / 1000
        await pause(pause_s)  # a cancellation the pool lost ends the wait: no lease taken for a caller gone


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
        forget_prepared(conn)  # the server skipped the rest of the pipeline, a Parse psycopg counts as done included
        await conn.execute("ROLLBACK")
        return False
    return await cur.fetchone() is not None


async def release_lease(pool, lease: ThreadLease) -> bool:
    """Delete ``lease``'s row (only if it still carries its token); True when it did."""
    async with pool.connection() as conn:
        cur = await conn.execute(RELEASE_LEASE, (lease.thread_id, lease.owner_token))
        return cur.rowcount == 1


async def keep_alive(pool, lease: ThreadLease, *, interval_ms: int = HEARTBEAT_INTERVAL_MS) -> None:
    """Renew ``lease`` every ``interval_ms`` milliseconds by its own TTL (:data:`HEARTBEAT_LEASE`), until
    cancelled: run it as a task beside the run that holds the lease. Returns only by cancellation.

    A renewal that fails (a lost connection, an exhausted pool) is logged and the next one tried; a lease
    another run has taken over is not renewed, and the holder's next batch is refused (:class:`LeaseLost`).
    A row locked by a batch of the same run is skipped: that batch renews it as its first statement."""
    params = {"thread": lease.thread_id, "owner": lease.owner_token}
    while True:
        await pause(interval_ms / 1000)  # ends on a cancellation the pool lost while handing out a connection
        try:
            async with pool.connection() as conn:
                await conn.execute(HEARTBEAT_LEASE, params)
        except Exception as exc:  # noqa: BLE001 (a missed renewal is no error: the lease outlives several)
            log.warning("could not renew the lease of thread %r: %s", lease.thread_id, exc)


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
