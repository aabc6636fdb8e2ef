"""The graph around the node: retries of infrastructure errors only (C01), a node retry after the
commit (C07), a connection killed mid-batch and a loss during COMMIT (C10)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from psycopg.pq import TransactionStatus

from agentlab.core.graph import run_config
from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from agentlab.domains.billing.scenarios import PlannedCall
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

BATCH = [
    PlannedCall("CreateInvoice", {"customer_id": 3, "billing_period": "2026-05-01", "amount_cents": 9000}),
    PlannedCall("QueueCharge", {"customer_id": 3, "billing_period": "2026-05-01", "amount_cents": 9000}),
    PlannedCall("CreateCreditMemo", {"customer_id": 3, "reference": "GOODWILL-1", "amount_cents": 500}),
]


async def run(h, node, script, thread_id, tenant_id="globex"):
    from agentlab.core.graph import build_graph

    graph = build_graph(ScriptedChatModel(script=script, seed=1), node, checkpointer=h.saver)
    state = await graph.ainvoke({"messages": [HumanMessage("go")]}, run_config(thread_id, tenant_id=tenant_id))
    return state


async def kill_backend_of(h, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(h.url, autocommit=True) as other:
        await other.execute("SELECT pg_terminate_backend(%s)", (pid,))


def batch_messages(state, ai_index=0):
    ais = [m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    ids = [tc["id"] for tc in ais[ai_index].tool_calls]
    tms = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
    return ids, [tms.get(i) for i in ids]


async def test_c01_infrastructure_error_in_one_call_retries_the_node_and_applies_each_call_once(harness):
    node = harness.node(preset("full"))
    seen = {"attempts": 0, "rows_before_retry": None}

    async def kill_during_queue_charge(call, index):
        if call.name == "CreateInvoice":
            seen["attempts"] += 1
            if seen["attempts"] == 2:  # the retry starts: the failed attempt left nothing behind
                async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as c:
                    seen["rows_before_retry"] = (await (await c.execute(
                        "SELECT (SELECT count(*) FROM invoices WHERE customer_id = 3),"
                        " (SELECT count(*) FROM outbox), (SELECT count(*) FROM tool_executions)")).fetchone())
        if call.name == "QueueCharge" and seen["attempts"] == 1:
            await kill_backend_of(harness, await _node_backend_pid(harness))

    node.hooks.before_call.append(kill_during_queue_charge)
    state = await run(harness, node, [BATCH], f"t-c01-{uuid.uuid4().hex[:6]}")

    ids, answers = batch_messages(state)
    assert [m.tool_call_id for m in answers] == ids  # exactly 3 ToolMessages, in call order
    assert [m.artifact["outcome"] for m in answers] == ["applied"] * 3
    assert seen["attempts"] == 2 and seen["rows_before_retry"] == (0, 0, 0)
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 3") == 1
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = 3") == 1
    assert await scalar(harness, "SELECT count(*) FROM outbox") == 1
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 3
    await harness.events.flush()
    infra = await fetch(harness, "SELECT attempt, error_class FROM events WHERE outcome = 'infrastructure_error'")
    assert len(infra) == 1 and infra[0][0] == 1 and infra[0][1].startswith("psycopg")
    assert unanswered_tool_calls(state["messages"]) == []


async def _node_backend_pid(h) -> int:
    """The pid of the backend that is in a transaction on this database (the node's)."""
    async with await psycopg.AsyncConnection.connect(h.url, autocommit=True) as c:
        row = await (await c.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()")).fetchone()
    return row[0]


async def test_constraint_violation_is_not_retried_by_the_graph(harness):
    node = harness.node(preset("full"))
    attempts = []
    node.hooks.before_call.append(lambda call, index: attempts.append(call.name))
    over = [PlannedCall("ApplyCredit", {"customer_id": 5, "amount_cents": 999_999})]
    state = await run(harness, node, [over], "t-no-retry", tenant_id="initech")
    assert attempts == ["ApplyCredit"]  # ran once: a CHECK violation is told to the model, not retried
    assert state["rollbacks_total"] == 1 and not state.get("escalated")
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 5") == 2500


async def test_escalation_after_three_consecutive_rolled_back_batches(harness):
    node = harness.node(preset("full").replace(lock_timeout_ms=50))
    async with await psycopg.AsyncConnection.connect(harness.url) as holder:  # a real second session
        await holder.execute("SELECT * FROM customers WHERE id = 5 FOR UPDATE")
        state = await run(harness, node, [[PlannedCall("ApplyCredit", {"customer_id": 5, "amount_cents": 100})]],
                          "t-escalate", tenant_id="initech")
        await holder.rollback()
    assert state["escalated"] is True and state["rollbacks"] == 3
    assert "3 consecutive batches were rolled back" in state["escalation_reason"]
    # each batch: the RetryPolicy tried the node 3 times on the busy lock, then the node answered
    await harness.events.flush()
    rows = await fetch(harness, "SELECT attempt, count(*) FROM events WHERE outcome = 'infrastructure_error' "
                                "GROUP BY attempt ORDER BY attempt")
    assert rows == [(1, 3), (2, 3), (3, 3)]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 5") == 2500


async def test_c07_node_retry_after_the_commit_replays_stored_results(harness):
    node = harness.node(preset("full"))
    fired = []

    def crash_once_after_commit(calls):
        if not fired:
            fired.append(True)
            raise ConnectionError("connection reset after COMMIT, before the node returned")

    node.hooks.after_commit.append(crash_once_after_commit)
    state = await run(harness, node, [BATCH], "t-c07")
    ids, answers = batch_messages(state)
    assert [m.artifact["outcome"] for m in answers] == ["replayed"] * 3
    stored = await fetch(harness, "SELECT tool_call_id, result FROM tool_executions ORDER BY created_at")
    stored = {k: v for k, v in stored}
    import json
    for i, m in zip(ids, answers):
        assert json.loads(m.content) == stored[i]  # the retry's ToolMessages carry the stored results
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 3") == 1
    assert await scalar(harness, "SELECT count(*) FROM outbox") == 1
    drained = await harness.worker.drain()
    assert drained.dispatched == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = 'cus_3'") == 1


async def test_c10_killed_connection_leaves_no_partial_batch_and_a_healthy_pool(harness):
    node = harness.node(preset("full"))

    async def kill_on_second_call(call, index):
        if index == 1:
            await kill_backend_of(harness, await _node_backend_pid(harness))

    node.hooks.before_call.append(kill_on_second_call)
    calls = [{"name": c.tool, "args": c.args, "id": f"call_{i}", "type": "tool_call"} for i, c in enumerate(BATCH)]
    with pytest.raises(psycopg.OperationalError):
        await node.run_batch(calls, thread_id="t-c10", tenant_id="globex")
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 3") == 0
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
    await harness.events.flush()
    (cls, detail), = await fetch(harness, "SELECT error_class, detail FROM events WHERE outcome = 'infrastructure_error'")
    assert "terminating connection" in detail or "AdminShutdown" in cls  # the original cause is kept
    for _ in range(harness.pool.max_size):  # every connection the pool hands out next is healthy and idle
        async with harness.pool.connection() as conn:
            assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
            assert conn.info.transaction_status is TransactionStatus.IDLE


async def test_c10_a_loss_during_commit_is_resolved_from_the_ledger(harness):
    node = harness.node(preset("full"))
    node.hooks.after_commit.append(_lose_commit_answer)
    calls = [{"name": c.tool, "args": c.args, "id": f"call_{i}", "type": "tool_call"} for i, c in enumerate(BATCH)]
    batch = await node.run_batch(calls, thread_id="t-c10b", tenant_id="globex", final_attempt=True)
    # the COMMIT landed; its answer was lost: the ledger tells, the calls are not applied again
    assert [r.outcome for r in batch.results] == [Outcome.REPLAYED] * 3
    assert not batch.rolled_back
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 3") == 1


def _lose_commit_answer(calls):
    raise psycopg.OperationalError("server closed the connection unexpectedly")


async def test_last_attempt_answers_not_applied_when_nothing_committed(harness):
    node = harness.node(preset("full"))

    async def kill(call, index):
        if index == 0:
            await kill_backend_of(harness, await _node_backend_pid(harness))

    node.hooks.before_call.append(kill)
    calls = [{"name": c.tool, "args": c.args, "id": f"call_{i}", "type": "tool_call"} for i, c in enumerate(BATCH)]
    batch = await node.run_batch(calls, thread_id="t-last", tenant_id="globex", final_attempt=True)
    assert [r.outcome for r in batch.results] == [Outcome.NOT_APPLIED] * 3
    assert all(r.content.startswith("NOT APPLIED: the database was temporarily unavailable") for r in batch.results)
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 3") == 0
