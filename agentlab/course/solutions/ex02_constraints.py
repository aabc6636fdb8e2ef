"""Exercises of notebook 02 (schema constraints as the last line of defence)."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from agentlab import new_customer, preset, tool_calls

REFUND_REFERENCE = "RMA-2001"
COUNT_REFUNDS = "SELECT count(*) AS n FROM {}.refunds WHERE customer_id = %s AND reference = %s"


async def duplicate_refund(h, preset_name: str) -> dict:
    """Exercise 2.1: a model sends the same ``QueueRefund`` in two turns (same customer, same reference).

    Returns, read from the database and the provider: ``refund_rows`` for that reference,
    ``provider_refunds`` for the customer, and the ``second_call`` outcome.
    """
    sg = preset(preset_name)
    customer = await new_customer(h, 5000, schema=sg.schema)
    node = h.node(sg)
    args = {"customer_id": customer, "reference": REFUND_REFERENCE, "amount_cents": 1500}
    thread = f"ex02-refund-{uuid.uuid4().hex[:12]}"
    await node.run_batch(tool_calls(("QueueRefund", args), prefix="turn1"), tenant_id="acme", thread_id=thread)
    second = await node.run_batch(tool_calls(("QueueRefund", args), prefix="turn2"), tenant_id="acme", thread_id=thread)
    await h.worker.drain()
    rows = await h.df(sql.SQL(COUNT_REFUNDS).format(sql.Identifier(sg.schema)), (customer, REFUND_REFERENCE))
    return {
        "refund_rows": int(rows.n[0]),
        "provider_refunds": len([p for p in await h.provider.payments(customer) if p["kind"] == "refund"]),
        "second_call": second.results[0].outcome.value,
    }


ADD_CHECK = "ALTER TABLE lax.customers ADD CONSTRAINT lax_credit_nonnegative CHECK (credit_cents >= 0)"
ADD_CHECK_NOT_VALID = ADD_CHECK + " NOT VALID"
DROP_CHECK = "ALTER TABLE lax.customers DROP CONSTRAINT IF EXISTS lax_credit_nonnegative"
VALIDATE_CHECK = "ALTER TABLE lax.customers VALIDATE CONSTRAINT lax_credit_nonnegative"


async def check_on_a_table_with_bad_rows(h) -> dict:
    """Exercise 2.2: add ``CHECK (credit_cents >= 0)`` to ``lax.customers`` once a row already breaks it.

    Steps: drive one lax customer below zero with the ``naive`` preset; try ``ADD CONSTRAINT`` (refused:
    PostgreSQL checks every existing row); add it ``NOT VALID`` (accepted: only new writes are checked);
    send another over-balance deduction (refused now); ``VALIDATE CONSTRAINT`` (refused while the old
    row breaks the rule); repair the old row (a business decision: here, set it to 0) and validate.
    Returns the SQLSTATE or ``"ok"`` of each step and the balances read back.
    """
    async with h.pool.connection() as conn:
        await conn.execute(DROP_CHECK)  # the exercise can be run again on the same database
    node = h.node(preset("naive"))
    bad = await new_customer(h, 1000, schema="lax")
    other = await new_customer(h, 1000, schema="lax")
    thread = f"ex02-check-{uuid.uuid4().hex[:12]}"
    await node.run_batch(tool_calls(("ApplyCredit", {"customer_id": bad, "amount_cents": 1500}), prefix="over"),
                         tenant_id="acme", thread_id=thread)
    out: dict = {"balance_after_naive_deduction": await _balance(h, bad)}
    async with h.pool.connection() as conn:
        out["add_constraint"] = await _try(conn, ADD_CHECK)
        out["add_constraint_not_valid"] = await _try(conn, ADD_CHECK_NOT_VALID)
    batch = await node.run_batch(tool_calls(("ApplyCredit", {"customer_id": other, "amount_cents": 1500}),
                                            prefix="over-again"), tenant_id="acme", thread_id=thread)
    out["new_over_balance_deduction"] = batch.results[0].outcome.value
    out["other_balance"] = await _balance(h, other)
    out["old_row_balance"] = await _balance(h, bad)
    async with h.pool.connection() as conn:
        out["validate_before_repair"] = await _try(conn, VALIDATE_CHECK)
        await conn.execute("UPDATE lax.customers SET credit_cents = 0 WHERE credit_cents < 0")
        out["validate_after_repair"] = await _try(conn, VALIDATE_CHECK)
    return out


async def _try(conn, statement: str) -> str:
    try:
        await conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate or type(exc).__name__
    return "ok"


async def _balance(h, customer_id: int) -> int:
    df = await h.df("SELECT credit_cents FROM lax.customers WHERE id = %s", (customer_id,))
    return int(df.credit_cents[0])
