"""Opening a batch's transaction: BEGIN, the local settings, the thread's lock and the ledger look-up.

:func:`open_batch` sends them pipelined, one round trip (:func:`prelude` builds the one SELECT that sets
``statement_timeout`` / ``lock_timeout``, the agent role and tenant under isolation, and takes
``pg_advisory_xact_lock`` on the thread). They stay separate statements: in READ COMMITTED each takes
its own snapshot when it starts, so the look-up sees every batch that committed while this one waited
for the thread's lock (in the same statement as the lock it would not).

Sources: PostgreSQL docs "Advisory Locks", "statement_timeout", "SET" (``SET LOCAL``), "Transaction
Isolation"; psycopg docs "Pipeline mode support".
"""

from __future__ import annotations

from typing import Any

from agentlab.core.batch.calls import Call
from agentlab.core.batch.ledger import LEDGER_LOOKUP_WITH_ARGS
from agentlab.core.batch.strategy import Batch
from agentlab.core.isolation import TenantMismatch, isolation_prelude
from agentlab.core.run_lock import RENEW_LEASE, LeaseLost
from agentlab.core.safeguards import READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE, Safeguards
from agentlab.core.schema import STRICT_SCHEMA

BEGIN, COMMIT, ROLLBACK = "BEGIN", "COMMIT", "ROLLBACK"
# the batch's BEGIN per isolation level (Safeguards.isolation_level); read committed is the server's default
BEGIN_AT = {READ_COMMITTED: BEGIN, REPEATABLE_READ: "BEGIN ISOLATION LEVEL REPEATABLE READ",
            SERIALIZABLE: "BEGIN ISOLATION LEVEL SERIALIZABLE"}
# The thread's tenant: bound by the thread's first batch, read back by every later one. Under isolation it
# runs as the agent role after the prelude, so another tenant's binding is invisible: no row = not yours.
BIND_THREAD_TENANT = """
WITH bound AS (INSERT INTO thread_tenants (thread_id, tenant_id) VALUES (%(thread)s, %(tenant)s)
               ON CONFLICT (thread_id) DO NOTHING RETURNING tenant_id)
SELECT tenant_id FROM bound UNION ALL SELECT tenant_id FROM thread_tenants WHERE thread_id = %(thread)s
"""
THREAD_TENANT = "SELECT tenant_id FROM thread_tenants WHERE thread_id = %s"
LEASE_LOST = ("this run no longer holds its thread (another run took it over after this run's lease expired); "
              "nothing of this batch was applied")


def prelude(sg: Safeguards, thread_id: str, tenant_id: str | None) -> tuple[str, list[Any]] | None:
    """One SELECT that sets the batch's local settings and takes the thread's advisory lock; under
    isolation it first switches to the agent role and the thread's tenant (:mod:`agentlab.core.isolation`).
    None when no setting is on."""
    parts: list[str] = []
    params: list[Any] = []
    if sg.isolation:
        parts, params = isolation_prelude(tenant_id)
    if sg.schema != STRICT_SCHEMA:
        parts.append("set_config('search_path', %s, true)")
        params.append(f"{sg.schema}, public")
    if sg.timeouts:
        parts += ["set_config('statement_timeout', %s, true)", "set_config('lock_timeout', %s, true)"]
        params += [f"{sg.statement_timeout_ms}ms", f"{sg.lock_timeout_ms}ms"]
    if sg.lock:
        parts.append("pg_advisory_xact_lock(hashtextextended(%s, 0))")
        params.append(thread_id)
    if not parts:
        return None
    return "SELECT " + ", ".join(parts), params


async def open_batch(conn, batch: Batch, calls: list[Call]) -> dict[str, tuple]:
    """BEGIN, the prelude and the ledger look-up for ``calls``, pipelined: one round trip. Returns
    ``{key: (args, result)}`` of the calls the ledger holds.

    With a ``run_token`` the thread's lease is renewed right after BEGIN, in the same round trip
    (:data:`agentlab.core.run_lock.RENEW_LEASE`): the lease row stays locked until COMMIT. With a tenant the
    thread is bound to it (:data:`BIND_THREAD_TENANT`). BEGIN carries the isolation level (:data:`BEGIN_AT`).

    Raises:
        TenantMismatch: the thread belongs to another tenant (the caller rolls back).
        LeaseLost: the run no longer holds the thread's lease (the caller rolls back).
    """
    sg, thread_id, tenant_id = batch.safeguards, batch.thread_id, batch.tenant_id
    settings = prelude(sg, thread_id, tenant_id)
    cur = bind = lease = None
    async with conn.pipeline():
        await conn.execute(BEGIN_AT[sg.isolation_level])
        if batch.run_token is not None:
            lease = await conn.execute(RENEW_LEASE, (batch.lease_ttl_ms, thread_id, batch.run_token))
        if settings is not None:
            await conn.execute(*settings)
        if tenant_id is not None:
            bind = await conn.execute(BIND_THREAD_TENANT, {"thread": thread_id, "tenant": tenant_id})
        if sg.ledger:
            cur = await conn.execute(LEDGER_LOOKUP_WITH_ARGS, ([batch.key(c) for c in calls],))
    if lease is not None and await lease.fetchone() is None:
        raise LeaseLost(LEASE_LOST)
    bound = await bind.fetchall() if bind is not None else None
    if bound == []:  # a twin batch bound the thread and committed after this statement's snapshot was taken
        bound = await (await conn.execute(THREAD_TENANT, (thread_id,))).fetchall()
    if bound is not None and tenant_id not in {t for t, in bound}:
        raise TenantMismatch("this thread belongs to another tenant; use the thread's own tenant or a new thread")
    return {k: (a, r) for k, a, r in await cur.fetchall()} if cur is not None else {}
