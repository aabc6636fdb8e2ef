"""Case C09: 3 calls in one transaction, the second violates UNIQUE.

A: without savepoints (the ``transaction`` preset) the third call meets "current transaction is
aborted" (SQLSTATE 25P02) and is reported NOT APPLIED, not as its own failure; PostgreSQL turns the
COMMIT into a ROLLBACK, so the first call, reported applied, is lost (the trap the lab counts).
B: with savepoints (``full``) call 2 FAILED with a sanitized reason, calls 1 and 3 NOT APPLIED, the
database unchanged and every connection back to idle.
"""

from __future__ import annotations

from agentlab.core.errors import find_leaks
from agentlab.core.messages import EARLIER_CALL_FAILED, FAILED_PREFIX, NOT_APPLIED_TEMPLATE
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from conftest import fetch, scalar


def batch(customer_id: int) -> list[dict]:
    return [
        {"name": "CreateInvoice", "args": {"customer_id": customer_id, "billing_period": "2026-04-01",
                                           "amount_cents": 1000}, "id": "c1", "type": "tool_call"},
        {"name": "CreateInvoice", "args": {"customer_id": customer_id, "billing_period": "2026-03-01",
                                           "amount_cents": 1000}, "id": "c2", "type": "tool_call"},  # exists
        {"name": "ApplyCredit", "args": {"customer_id": customer_id, "amount_cents": 100}, "id": "c3",
         "type": "tool_call"},
    ]


async def with_existing_invoice(harness, customer_id: int) -> None:
    async with harness.pool.connection() as conn:
        await conn.execute("INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                           "VALUES ('acme', %s, '2026-03-01', 500)", (customer_id,))


async def state(harness, customer_id: int):
    invoices = await fetch(harness, "SELECT billing_period::text FROM invoices WHERE customer_id = %s ORDER BY 1",
                           (customer_id,))
    credit = await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer_id,))
    return [r[0] for r in invoices], credit


async def test_c09_without_savepoints_the_third_call_is_not_blamed(harness):
    await with_existing_invoice(harness, 1)
    before = await state(harness, 1)
    result = await harness.node(preset("transaction")).run_batch(batch(1), thread_id="t-c09-a", tenant_id="acme")

    first, second, third = result.results
    assert second.outcome is Outcome.FAILED
    assert second.translation.sqlstate == "23505"
    assert third.outcome is Outcome.NOT_APPLIED  # 25P02 is never the third call's own fault
    assert third.translation.sqlstate == "25P02"
    assert third.content == NOT_APPLIED_TEMPLATE.format(reason=EARLIER_CALL_FAILED)
    # the trap: call 1 was reported applied as it returned, and the COMMIT became a ROLLBACK
    assert first.outcome is Outcome.APPLIED
    assert result.rolled_back
    assert await state(harness, 1) == before == (["2026-03-01"], 5000)


async def test_c09_with_savepoints_one_failed_two_not_applied_database_unchanged(harness):
    await with_existing_invoice(harness, 1)
    before = await state(harness, 1)
    result = await harness.node(preset("full")).run_batch(batch(1), thread_id="t-c09-b", tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.NOT_APPLIED, Outcome.FAILED, Outcome.NOT_APPLIED]
    failed = result.results[1]
    assert failed.content.startswith(f"{FAILED_PREFIX} [conflict]")
    assert find_leaks(failed.content) == []
    assert all(find_leaks(r.content) == [] for r in result.results)
    assert result.rolled_back
    assert await state(harness, 1) == before
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = 't-c09-b'") == 0
    # every session of this database is back to idle (none left idle in transaction or aborted)
    states = await fetch(harness, "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                                  "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    assert states and all(s == "idle" for (s,) in states)
