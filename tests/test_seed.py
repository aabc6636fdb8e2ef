"""The seed's three tests, on a real PostgreSQL: asserted from the database's rows."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from conftest import scalar


def calls(*specs):
    return [{"name": n, "args": a, "id": f"call_{i}", "type": "tool_call"} for i, (n, a) in enumerate(specs)]


async def test_failing_second_call_rolls_back_the_first(harness):
    node = harness.node(preset("full"))
    batch = await node.run_batch(calls(
        ("CreateInvoice", {"customer_id": 1, "billing_period": "2026-03-01", "amount_cents": 1200}),
        ("ApplyCredit", {"customer_id": 1, "amount_cents": 999_999}),  # over the balance: CHECK
    ), thread_id="t-seed-1", tenant_id="acme")
    assert [r.outcome for r in batch.results] == [Outcome.NOT_APPLIED, Outcome.FAILED]
    assert batch.rolled_back
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 1") == 0
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1") == 5000


async def test_replay_of_a_batch_does_not_apply_twice(harness):
    node = harness.node(preset("full"))
    batch_calls = calls(("ApplyCredit", {"customer_id": 2, "amount_cents": 700}))
    first = await node.run_batch(batch_calls, thread_id="t-seed-2", tenant_id="acme")
    second = await node.run_batch(batch_calls, thread_id="t-seed-2", tenant_id="acme")
    assert first.results[0].outcome is Outcome.APPLIED
    assert second.results[0].outcome is Outcome.REPLAYED
    assert second.results[0].content == first.results[0].content
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 2") == 12000 - 700
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = 't-seed-2'") == 1


async def test_killing_the_backend_mid_batch_leaves_the_tables_unchanged(harness):
    node = harness.node(preset("full"))

    async def kill_own_backend(call, index):
        if index == 1:  # during the second call, another session terminates this backend
            async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as other:
                await other.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state = 'idle in transaction'"
                )
            await asyncio.sleep(0.05)

    node.hooks.before_call.append(kill_own_backend)
    with pytest.raises(psycopg.OperationalError):
        await node.run_batch(calls(
            ("CreateInvoice", {"customer_id": 1, "billing_period": "2026-04-01", "amount_cents": 1200}),
            ("ApplyCredit", {"customer_id": 1, "amount_cents": 100}),
        ), thread_id="t-seed-3", tenant_id="acme")
    assert await scalar(harness, "SELECT count(*) FROM invoices") == 0
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1") == 5000
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
