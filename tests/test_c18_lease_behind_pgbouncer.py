"""C18 behind a transaction-mode pooler: one writer per thread still holds when every statement may be
lent another server session.

Each test starts a real PgBouncer (``pool_mode = transaction``, two server connections) in front of the
test's PostgreSQL and opens the harness through it (``behind_pooler=True``). The thread lease
(:mod:`agentlab.core.run_lock`) is a row, never a session lock: it is taken and released by one autocommit
statement each, and renewed as the first statement of each batch's own transaction, so whichever server
session the pooler lends, every client sees the same row. What must hold:

- two runs on one thread at once: the second is refused with ThreadBusy (its clear message), or with a
  bounded wait follows the first; the thread's checkpoint chain does not fork; the money moves once;
- a run whose lease expired and was taken over is refused at its next batch (LeaseLost), in the batch's
  transaction, before any tool SQL;
- no advisory lock is left on any server session; without the lease the chain forks through the pooler too.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from pooler import pgbouncer
from test_c18_two_runs_on_one_thread import CHAIN, play_two_runs

from agentlab.core.run_lock import (
    LeaseLost,
    ThreadBusy,
    acquire_lease,
    thread_lease,
)
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.lab.batches import tool_calls
from agentlab.runtime.harness import Harness

ADVISORY_LOCKS = """
SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


async def on_server(database_url: str, query: str, params=()) -> list[tuple]:
    """What the server itself holds, read on a direct connection (not through the pooler)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return await (await conn.execute(query, params)).fetchall()


async def two_runs_at_once(h: Harness, database_url: str, *, lease: bool, thread: str, wait_ms: int = 0):
    ids, results = await play_two_runs(h, lease=lease, thread=thread, wait_ms=wait_ms)
    cid = ids[0]
    (row,) = await on_server(database_url, f"""
        SELECT (SELECT credit_cents FROM customers WHERE id = {cid}),
               (SELECT count(*) FROM credit_memos WHERE customer_id = {cid}),
               (SELECT count(*) FROM refunds WHERE customer_id = {cid}),
               (SELECT count(*) FROM provider.payments WHERE customer = 'cus_{cid}'),
               (SELECT count(*) FROM runs.thread_leases WHERE thread_id = %s)""", (thread,))
    state = dict(zip(("credit", "memos", "refunds", "payments", "leases"), row))
    state["chain"] = (await on_server(database_url, CHAIN, {"t": thread}))[0]
    return results, state


async def test_c18_behind_pgbouncer_the_second_run_is_refused_and_the_chain_does_not_fork(database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            results, state = await two_runs_at_once(h, database_url, lease=True, thread="c18-pooled")
        finally:
            await h.close()
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], ThreadBusy), results
    assert "thread 'c18-pooled' has a run in progress; this run was refused" in str(refused[0])
    assert (state["memos"], state["refunds"], state["payments"], state["credit"]) == (1, 1, 1, 2500)
    checkpoints, roots, children = state["chain"]
    assert checkpoints > 1 and roots == 1 and children == 1  # one chain
    assert state["leases"] == 0  # released at the run's end, through the pooler
    assert await on_server(database_url, ADVISORY_LOCKS) == [(0,)]  # no session lock left on any server session


async def test_c18_behind_pgbouncer_a_bounded_wait_lets_the_second_run_follow_the_first(database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            results, state = await two_runs_at_once(h, database_url, lease=True, thread="c18-pooled-wait",
                                                    wait_ms=20_000)
        finally:
            await h.close()
    assert not any(isinstance(r, BaseException) for r in results), results
    assert (state["memos"], state["refunds"], state["payments"], state["credit"]) == (1, 1, 1, 2500)
    _checkpoints, roots, children = state["chain"]
    assert roots == 1 and children == 1


async def test_c18_behind_pgbouncer_without_the_lease_the_chain_forks(database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            results, state = await two_runs_at_once(h, database_url, lease=False, thread="c18-pooled-no-lease")
        finally:
            await h.close()
    assert not any(isinstance(r, BaseException) for r in results), results
    _checkpoints, roots, _children = state["chain"]
    assert roots == 2  # the weaker setting's violation shows through the pooler as on the server


async def test_c18_behind_pgbouncer_a_lease_taken_over_refuses_the_old_runs_batch(database_url):
    sg = preset("full")
    with pgbouncer(database_url, pool_size=2) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            ids = await h.create_customers(get_scenario("refund"), sg)
            old = await acquire_lease(h.pool, "c18-pooled-expired", ttl_ms=1)
            await asyncio.sleep(0.01)
            with pytest.raises(ThreadBusy):  # a live lease is seen by every pooled client
                async with thread_lease(h.pool, "c18-pooled-expired", ttl_ms=60_000):
                    await acquire_lease(h.pool, "c18-pooled-expired")
            async with thread_lease(h.pool, "c18-pooled-expired") as new:
                assert new.owner_token != old.owner_token
                batch = tool_calls(("ApplyCredit", {"customer_id": ids[0], "amount_cents": 500}), prefix="c18-old")
                with pytest.raises(LeaseLost, match="no longer holds its thread"):
                    await h.node(sg).run_batch(batch, thread_id="c18-pooled-expired", tenant_id="acme",
                                               run_token=old.owner_token)
        finally:
            await h.close()
    assert await on_server(database_url, "SELECT credit_cents FROM customers WHERE id = %s", (ids[0],)) == [(5000,)]
    assert await on_server(database_url, "SELECT count(*) FROM runs.thread_leases") == [(0,)]
