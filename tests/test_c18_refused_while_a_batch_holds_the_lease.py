"""C18: a second run is refused while a batch of the first holds the thread's lease row.

Every batch of a leased run renews the lease as its first statement (RENEW_LEASE), so the lease row is
locked until that batch's COMMIT. The second run's acquisition must not wait for that lock: had it waited,
and had the first run ended and deleted its row meanwhile, the second run's INSERT would have succeeded
and it would have followed the first instead of being refused, even with ``wait_ms=0``. The acquisition
locks the row with ``FOR UPDATE NOWAIT`` first (SQLSTATE 55P03 = busy). Each acquisition here is bounded
by ``asyncio.wait_for``, so an acquisition that waits on the lock fails the test instead of hanging it.
The last test plays the refusal behind PgBouncer in transaction mode.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage
from pooler import pgbouncer
from psycopg.pq import TransactionStatus
from test_c18_lease_behind_pgbouncer import on_server
from test_c18_two_runs_on_one_thread import CHAIN

from agentlab.core.graph import build_graph, run_config
from agentlab.core.run_lock import (
    RENEW_LEASE,
    ThreadBusy,
    acquire_lease,
    invoke_with_lease,
    release_lease,
)
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.runtime.harness import Harness
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

BOUND_S = 10  # far above a refusal (milliseconds), far below a hang
LEASES = "SELECT owner_token FROM runs.thread_leases WHERE thread_id = %s"
ABORTED = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle in transaction (aborted)'
"""


async def test_c18_refused_while_a_batch_holds_the_lease(harness):
    thread = "c18-batch-holds"
    first = await acquire_lease(harness.pool, thread)
    loop = asyncio.get_running_loop()
    async with harness.pool.connection() as batch:  # the first run's batch: BEGIN, RENEW_LEASE, not committed
        await batch.execute("BEGIN")
        renewed = await (await batch.execute(RENEW_LEASE, (60_000, thread, first.owner_token))).fetchone()
        assert renewed == (first.owner_token,)

        with pytest.raises(ThreadBusy, match="after waiting 0 ms"):
            await asyncio.wait_for(acquire_lease(harness.pool, thread, wait_ms=0), BOUND_S)
        assert batch.info.transaction_status == TransactionStatus.INTRANS  # refused while the batch is open

        t0 = loop.time()  # a bounded wait polls (the locked row counts as busy) and is refused at its bound
        with pytest.raises(ThreadBusy, match="after waiting 200 ms"):
            await asyncio.wait_for(acquire_lease(harness.pool, thread, wait_ms=200), BOUND_S)
        assert 0.19 <= loop.time() - t0 < BOUND_S

        await batch.execute("COMMIT")
    assert await fetch(harness, LEASES, (thread,)) == [(first.owner_token,)]  # the refused runs left no row
    assert await scalar(harness, ABORTED) == 0  # nor a pooled connection in a failed transaction

    assert await release_lease(harness.pool, first)  # the first run ends: the thread is free
    second = await asyncio.wait_for(acquire_lease(harness.pool, thread, wait_ms=0), BOUND_S)
    assert second.owner_token != first.owner_token
    assert await fetch(harness, LEASES, (thread,)) == [(second.owner_token,)]
    assert await release_lease(harness.pool, second)


async def test_c18_a_bounded_wait_follows_once_the_batch_has_committed_and_the_run_ended(harness):
    thread = "c18-batch-then-follow"
    first = await acquire_lease(harness.pool, thread)
    async with harness.pool.connection() as batch:
        await batch.execute("BEGIN")
        assert await (await batch.execute(RENEW_LEASE, (60_000, thread, first.owner_token))).fetchone()
        waiting = asyncio.create_task(acquire_lease(harness.pool, thread, wait_ms=10_000))
        await asyncio.sleep(0.15)
        assert not waiting.done()  # still within its bound, polling
        await batch.execute("COMMIT")
    assert not waiting.done()  # the committed batch left the first run's live lease: still busy
    assert await release_lease(harness.pool, first)
    second = await asyncio.wait_for(waiting, BOUND_S)
    assert second.owner_token != first.owner_token and second.waited_ms >= 150
    assert await fetch(harness, LEASES, (thread,)) == [(second.owner_token,)]
    await release_lease(harness.pool, second)


async def test_c18_a_run_started_while_the_first_is_inside_a_batch_is_refused(harness):
    """The real interleaving: run B starts through ``invoke_with_lease`` from inside A's first batch
    (before A's first call, after its RENEW_LEASE); B must be refused while A's batch is still open."""
    sc, sg = get_scenario("refund"), preset("full")
    ids = await harness.create_customers(sc, sg)
    thread = "c18-inside-a-batch"
    config = run_config(thread, tenant_id=sc.tenant_id)

    def graph(seed: int, node):
        return build_graph(ScriptedChatModel(script=sc.script(ids), seed=seed), node, checkpointer=harness.saver)

    def run(g):
        return invoke_with_lease(g, harness.pool, {"messages": [HumanMessage(sc.prompt)]}, config, wait_ms=0,
                                 durability="sync")

    node_a, seen = harness.node(sg), {}
    graph_b = graph(1, harness.node(sg))

    async def start_b_inside_the_batch(call, index):
        if "b" in seen:
            return
        seen["b"] = b = asyncio.create_task(run(graph_b))
        done, _ = await asyncio.wait({b}, timeout=BOUND_S)  # A's batch stays open meanwhile
        seen["ended_inside_a_batch"] = b in done

    node_a.hooks.before_call.append(start_b_inside_the_batch)
    done_a = await asyncio.wait_for(run(graph(0, node_a)), 6 * BOUND_S)
    b_outcome = await asyncio.gather(seen["b"], return_exceptions=True)
    await harness.worker.drain()

    assert seen["ended_inside_a_batch"] is True
    assert isinstance(b_outcome[0], ThreadBusy), b_outcome
    assert sum(isinstance(m, HumanMessage) for m in done_a["messages"]) == 1  # A's history alone
    cid = ids[0]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == 2500
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (cid,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{cid}",)) == 1
    checkpoints, roots, children = (await fetch(harness, CHAIN, {"t": thread}))[0]
    assert checkpoints > 1 and roots == 1 and children == 1  # one chain: B wrote no checkpoint
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases WHERE thread_id = %s", (thread,)) == 0


async def test_c18_behind_pgbouncer_refused_while_a_batch_holds_the_lease(database_url):
    """The same through PgBouncer in transaction mode (two server connections): the batch keeps one server
    session for its open transaction, the refused acquisition's failed transaction is rolled back on the
    other, and the thread is free for the next run once the first has ended."""
    thread = "c18-pooled-batch-holds"
    with pgbouncer(database_url, pool_size=2) as url:
        h = await Harness.open(url, behind_pooler=True)
        try:
            first = await acquire_lease(h.pool, thread)
            async with h.pool.connection() as batch:
                await batch.execute("BEGIN")
                assert await (await batch.execute(RENEW_LEASE, (60_000, thread, first.owner_token))).fetchone()
                for _ in range(3):  # each refusal gives its server session back clean for the next
                    with pytest.raises(ThreadBusy, match="after waiting 0 ms"):
                        await asyncio.wait_for(acquire_lease(h.pool, thread, wait_ms=0), BOUND_S)
                await batch.execute("COMMIT")
            assert await release_lease(h.pool, first)
            second = await asyncio.wait_for(acquire_lease(h.pool, thread), BOUND_S)
            assert await on_server(database_url, LEASES, (thread,)) == [(second.owner_token,)]
            assert await release_lease(h.pool, second)
        finally:
            await h.close()
    assert await on_server(database_url, ABORTED) == [(0,)]
    assert await on_server(database_url, LEASES, (thread,)) == []
