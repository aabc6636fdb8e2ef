"""Exercises of notebook 07 (the idempotency ledger, a crash between commit and checkpoint)."""

from __future__ import annotations

import uuid

from langchain_core.messages import HumanMessage

from agentlab import (
    Harness,
    PlannedCall,
    ScriptedChatModel,
    SimulatedCrash,
    build_graph,
    customer_rows,
    new_customer,
    preset,
    run_config,
)

OPENING_CREDIT_CENTS = 5000
LEDGER_ROWS = "SELECT count(*) AS n FROM tool_executions WHERE thread_id = %s"
REPORT = """
SELECT t.tool_name AS tool,
       (SELECT count(*) FROM events e WHERE e.thread_id = %(t)s AND e.tool_name = t.tool_name
          AND e.outcome = 'applied') AS applied,
       (SELECT count(*) FROM events e WHERE e.thread_id = %(t)s AND e.tool_name = t.tool_name
          AND e.outcome = 'replayed') AS replayed,
       (SELECT count(*) FROM tool_executions x WHERE x.thread_id = %(t)s AND x.tool_name = t.tool_name) AS ledger_rows
FROM (SELECT tool_name FROM events WHERE thread_id = %(t)s AND tool_name IS NOT NULL
      UNION SELECT tool_name FROM tool_executions WHERE thread_id = %(t)s) t
ORDER BY t.tool_name
"""


def _script(customer: int) -> list[list[PlannedCall]]:
    return [[
        PlannedCall("CreateCreditMemo", {"customer_id": customer, "reference": "RMA-1042", "amount_cents": 2500}),
        PlannedCall("ApplyCredit", {"customer_id": customer, "amount_cents": 2500}),
        PlannedCall("QueueRefund", {"customer_id": customer, "reference": "RMA-1042", "amount_cents": 2500}),
    ]]


async def crash_and_resume(h, *, ledger: bool, crash_point: str, thread_id: str | None = None) -> dict:
    """Exercise 7.1: crash the tools node at ``crash_point`` ("after_commit" or "before_commit"), resume
    the thread in a new Harness on the same database, drain the outbox; return what the database holds."""
    if crash_point not in ("after_commit", "before_commit"):
        raise ValueError("crash_point must be 'after_commit' or 'before_commit'")
    customer = await new_customer(h, OPENING_CREDIT_CENTS)
    sg = preset("full").replace(ledger=ledger)
    thread = thread_id or f"ex07-crash-{uuid.uuid4().hex[:12]}"
    node = h.node(sg)

    def crash(*args):
        raise SimulatedCrash(f"the process died ({crash_point})")

    if crash_point == "after_commit":
        node.hooks.after_commit.append(crash)
    else:
        node.hooks.after_call.append(lambda call, index: crash() if index == 2 else None)
    graph = build_graph(ScriptedChatModel(script=_script(customer), seed=7), node, checkpointer=h.saver)
    prompt = HumanMessage("Refund RMA-1042: memo, deduct the store credit, refund the card.")
    try:
        await graph.ainvoke({"messages": [prompt]}, run_config(thread, tenant_id="acme"), durability="sync")
    except SimulatedCrash:
        pass
    restarted = await Harness.open(h.url)  # new pools, as after a restart
    try:
        graph = build_graph(ScriptedChatModel(script=_script(customer), seed=7), restarted.node(sg),
                            checkpointer=restarted.saver)
        await graph.ainvoke(None, run_config(thread, tenant_id="acme"), durability="sync")
        await restarted.events.flush()
    finally:
        await restarted.close()
    await h.worker.drain()
    held = (await customer_rows(h, [customer])).iloc[0]
    refunds = [p for p in await h.provider.payments(customer) if p["kind"] == "refund"]
    return {
        "credit_deducted_cents": OPENING_CREDIT_CENTS - int(held["credit_cents"]),
        "credit_memos": int(held["credit_memos"]),
        "provider_refunds": len(refunds),
        "ledger_rows": int((await h.df(LEDGER_ROWS, (thread,))).n[0]),
    }


async def ledger_report(h, thread_id: str):
    """Exercise 7.2: per tool of the thread, calls applied and replayed (events table) and ledger rows."""
    await h.events.flush()
    return await h.df(REPORT, {"t": thread_id})
