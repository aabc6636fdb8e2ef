"""C18: two runs on one thread at the same time (langgraph#8796).

The refund story twice at once (``asyncio.gather``) on one ``thread_id`` and one customer, models with
seeds 0 and 1 (fresh tool call ids, as two submissions of one request to a real LLM would have). The
advisory lock serializes batches, not runs: without the thread lease (``full`` with ``run_lock=False``)
both runs act and both write checkpoints from no parent, so the thread's checkpoint chain forks. With it
the second run is refused with ThreadBusy before it sends anything (the kit's decision: refuse, after an
optional bounded wait), and the database holds one memo, one refund, one deduction, one payment and one
chain. Here the runs go through ``invoke_with_lease``; the same through a plain ``graph.ainvoke`` is C41.
"""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.run_lock import (
    LeaseLost,
    ThreadBusy,
    acquire_lease,
    invoke_with_lease,
    release_lease,
    run_token,
    thread_lease,
)
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.lab.batches import tool_calls
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

CHAIN = """
SELECT count(*), count(*) FILTER (WHERE parent_checkpoint_id IS NULL),
       (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM checkpoints
         WHERE thread_id = %(t)s AND checkpoint_ns = '' GROUP BY parent_checkpoint_id) AS k)
FROM checkpoints WHERE thread_id = %(t)s AND checkpoint_ns = ''
"""


async def play_two_runs(h, *, lease: bool, thread: str, wait_ms: int = 0) -> tuple[list[int], list]:
    """The refund story twice at once on ``thread`` (models seeded 0 and 1), through ``invoke_with_lease``
    under ``full``, or without the thread lease (``full`` with ``run_lock=False``: the graph takes none
    either); the outbox drained. Returns the customer ids and the two runs' results (or what they raised)."""
    sc = get_scenario("refund")
    sg = preset("full") if lease else preset("full").replace(run_lock=False, name="full-without-run-lock")
    ids = await h.create_customers(sc, sg)

    async def run(seed: int):
        graph = build_graph(ScriptedChatModel(script=sc.script(ids), seed=seed), h.node(sg), checkpointer=h.saver)
        inputs, config = {"messages": [HumanMessage(sc.prompt)]}, run_config(thread, tenant_id=sc.tenant_id)
        if lease:
            return await invoke_with_lease(graph, h.pool, inputs, config, wait_ms=wait_ms, durability="sync")
        return await graph.ainvoke(inputs, config, durability="sync")

    results = await asyncio.gather(run(0), run(1), return_exceptions=True)
    await h.worker.drain()
    return ids, results


async def _two_runs_at_once(h, *, lease: bool, thread: str, wait_ms: int = 0):
    ids, results = await play_two_runs(h, lease=lease, thread=thread, wait_ms=wait_ms)
    cid = ids[0]
    state = {
        "credit": await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)),
        "memos": await scalar(h, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (cid,)),
        "refunds": await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)),
        "payments": await scalar(h, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{cid}",)),
        "chain": (await fetch(h, CHAIN, {"t": thread}))[0],
        "leases": await scalar(h, "SELECT count(*) FROM runs.thread_leases WHERE thread_id = %s", (thread,)),
    }
    return results, state


async def test_c18_without_the_lease_two_runs_on_one_thread_fork_its_checkpoint_chain(harness):
    results, state = await _two_runs_at_once(harness, lease=False, thread="c18-no-lease")
    assert not any(isinstance(r, BaseException) for r in results)
    _checkpoints, roots, _children = state["chain"]
    assert roots == 2  # both runs started from no checkpoint: two chains on one thread
    # the natural keys and the atomic batch still hold the money here; the history does not
    assert (state["memos"], state["refunds"], state["payments"], state["credit"]) == (1, 1, 1, 2500)


async def test_c18_with_the_lease_the_second_run_is_refused_and_the_chain_does_not_fork(harness):
    results, state = await _two_runs_at_once(harness, lease=True, thread="c18-lease")
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], ThreadBusy)
    assert "has a run in progress" in str(refused[0]) and "c18-lease" in str(refused[0])
    done = next(r for r in results if not isinstance(r, BaseException))
    assert sum(isinstance(m, HumanMessage) for m in done["messages"]) == 1  # one run's history, not interleaved
    assert (state["memos"], state["refunds"], state["payments"], state["credit"]) == (1, 1, 1, 2500)
    checkpoints, roots, children = state["chain"]
    assert checkpoints > 1 and roots == 1 and children == 1  # one chain: every checkpoint has one child at most
    assert state["leases"] == 0  # released at the run's end


async def test_c18_a_bounded_wait_lets_the_second_run_follow_the_first(harness):
    results, state = await _two_runs_at_once(harness, lease=True, thread="c18-wait", wait_ms=10_000)
    assert not any(isinstance(r, BaseException) for r in results)
    # the second run ran after the first, on its history: its memo and refund are refused by the natural
    # keys, so its batch rolls back and the credit is deducted once
    assert (state["memos"], state["refunds"], state["payments"], state["credit"]) == (1, 1, 1, 2500)
    _checkpoints, roots, children = state["chain"]
    assert roots == 1 and children == 1


async def test_c18_a_busy_thread_refuses_within_its_bound(harness):
    held = await acquire_lease(harness.pool, "c18-busy", ttl_ms=60_000)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(ThreadBusy, match="after waiting 150 ms"):
        await acquire_lease(harness.pool, "c18-busy", wait_ms=150)
    assert 0.14 <= loop.time() - t0 < 2.0
    again = await acquire_lease(harness.pool, "c18-busy", owner_token=held.owner_token)  # the same run resumes
    assert again.owner_token == held.owner_token
    assert await release_lease(harness.pool, held)
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases WHERE thread_id = 'c18-busy'") == 0


async def test_c18_an_expired_lease_is_taken_over_and_the_old_runs_next_batch_is_refused_in_its_transaction(harness):
    sg = preset("full")
    ids = await harness.create_customers(get_scenario("refund"), sg)
    old = await acquire_lease(harness.pool, "c18-expired", ttl_ms=1)
    await asyncio.sleep(0.01)
    async with thread_lease(harness.pool, "c18-expired") as new:
        assert new.owner_token != old.owner_token
        batch = tool_calls(("ApplyCredit", {"customer_id": ids[0], "amount_cents": 500}), prefix="c18-old")
        with pytest.raises(LeaseLost, match="no longer holds its thread"):
            await harness.node(sg).run_batch(batch, thread_id="c18-expired", tenant_id="acme",
                                             run_token=old.owner_token)
        assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (ids[0],)) == 5000
        assert run_token(new.configure(run_config("c18-expired"))) == new.owner_token
        applied = await harness.node(sg).run_batch(tool_calls(("ApplyCredit", {"customer_id": ids[0], "amount_cents": 500}),
                                                              prefix="c18-new"),
                                                   thread_id="c18-expired", tenant_id="acme", run_token=new.owner_token)
        assert not applied.rolled_back
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (ids[0],)) == 4500
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases WHERE thread_id = 'c18-expired'") == 0


async def test_c18_run_episode_holds_the_lease_under_full_and_not_under_ledger(harness):
    sc = get_scenario("refund")
    busy = await acquire_lease(harness.pool, "c18-episode")
    with pytest.raises(ThreadBusy):
        await harness.run_episode(sc, "full", thread_id="c18-episode", seed=0)
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = 'c18-episode'") == 0
    ep = await harness.run_episode(sc, "ledger", thread_id="c18-episode", seed=0)  # no run lock: runs beside it
    assert ep.error is None
    await release_lease(harness.pool, busy)
    ep = await harness.run_episode(sc, "full", thread_id="c18-episode-2", seed=0)
    assert ep.error is None and not ep.unanswered
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases") == 0
