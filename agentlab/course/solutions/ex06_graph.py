"""Exercises of notebook 06 (the graph: retries, escalation)."""

from __future__ import annotations

import uuid

import psycopg
from langchain_core.messages import AIMessage, HumanMessage

from agentlab import PlannedCall, ScriptedChatModel, build_graph, customer_rows, new_customer, preset, run_config

LOCK_CUSTOMER = "SELECT * FROM customers WHERE id = %s FOR UPDATE"
EVENT_COUNTS = """
SELECT count(*) FILTER (WHERE outcome = 'infrastructure_error') AS infrastructure_errors,
       count(*) FILTER (WHERE category = 'timeout') AS timeouts
FROM events WHERE thread_id = %s AND node = 'tools'
"""


def _one_credit_graph(h, node, customer: int):
    script = [[PlannedCall("ApplyCredit", {"customer_id": customer, "amount_cents": 100})]]
    return build_graph(ScriptedChatModel(script=script, seed=1), node, checkpointer=h.saver)


async def held_lock(h, statement_timeout_ms: int, lock_timeout_ms: int) -> dict:
    """Exercise 6.1: one ApplyCredit while another session holds the customer's row lock."""
    customer = await new_customer(h, 2500)
    node = h.node(preset("full").replace(statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms))
    graph = _one_credit_graph(h, node, customer)
    thread = f"ex06-held-{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(h.url) as holder:
        await holder.execute(LOCK_CUSTOMER, (customer,))
        state = await graph.ainvoke({"messages": [HumanMessage("Apply 1.00 of credit.")]}, run_config(thread, tenant_id="acme"))
        await holder.rollback()
    await h.events.flush()
    counts = (await h.df(EVENT_COUNTS, (thread,))).iloc[0]
    return {
        "escalated": bool(state.get("escalated")),
        "batches": sum(1 for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls),
        "infrastructure_errors": int(counts["infrastructure_errors"]),
        "timeouts_told_to_the_model": int(counts["timeouts"]),
        "final_credit_cents": await _credit_cents(h, customer),
    }


async def lock_released_on_retry(h) -> dict:
    """Exercise 6.2: the other session releases the row lock when the node starts its second attempt."""
    customer = await new_customer(h, 2500)
    node = h.node(preset("full").replace(lock_timeout_ms=50))
    graph = _one_credit_graph(h, node, customer)
    attempts = []
    async with await psycopg.AsyncConnection.connect(h.url) as holder:
        await holder.execute(LOCK_CUSTOMER, (customer,))

        async def release_on_second_attempt(call, index):
            attempts.append(call.call_id)
            if len(attempts) == 2:
                await holder.rollback()  # the other session lets go

        node.hooks.before_call.append(release_on_second_attempt)
        state = await graph.ainvoke({"messages": [HumanMessage("Apply 1.00 of credit.")]},
                                    run_config(f"ex06-released-{uuid.uuid4().hex[:12]}", tenant_id="acme"))
    answer = next(m for m in state["messages"] if getattr(m, "tool_call_id", None))
    return {
        "attempts": len(attempts),
        "outcome": answer.artifact["outcome"],
        "final_credit_cents": await _credit_cents(h, customer),
    }


async def _credit_cents(h, customer: int) -> int:
    return int((await customer_rows(h, [customer])).credit_cents[0])
