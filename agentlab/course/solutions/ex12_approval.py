"""Exercises of notebook 12 (human approval with interrupt())."""

from __future__ import annotations

import uuid

from langchain_core.messages import HumanMessage, ToolMessage

from agentlab import (
    APPROVAL,
    ApprovalPolicy,
    ScriptedChatModel,
    classify,
    interrupts_of,
    preset,
    resume_command,
    run_config,
)

COUNTS = """
SELECT (SELECT count(*) FROM refunds WHERE customer_id = %(customer)s) AS refunds,
       (SELECT count(*) FROM outbox WHERE thread_id = %(thread)s) AS outbox_rows,
       (SELECT count(*) FROM events WHERE thread_id = %(thread)s AND kind = 'node' AND node = 'tools') AS tools_runs
"""


async def _start(h, policy: ApprovalPolicy, prefix: str):
    sg = preset("full")
    ids = await h.create_customers(APPROVAL, sg)
    graph = h.graph(sg, ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=policy)
    thread = f"{prefix}-{uuid.uuid4().hex[:12]}"
    config = run_config(thread, tenant_id=APPROVAL.tenant_id)
    first = await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config)
    return graph, config, thread, ids[0], interrupts_of(first)


async def _counts(h, thread: str, customer: int) -> dict:
    await h.worker.drain()
    await h.events.flush()
    row = (await h.df(COUNTS, {"customer": customer, "thread": thread})).iloc[0]
    return {k: int(v) for k, v in row.items()}


async def approval_for_threshold(h, threshold_cents: int) -> dict:
    """Exercise 12.1: the approval story (refunds of 30,000 and 15,000 cents) under ``threshold_cents``;
    a request, if any, is approved."""
    graph, config, thread, customer, requests = await _start(h, ApprovalPolicy(threshold_cents=threshold_cents),
                                                             "ex12-threshold")
    if requests:
        await graph.ainvoke(resume_command("approve"), config)
    counts = await _counts(h, thread, customer)
    return {
        "requests": len(requests),
        "calls_in_request": [c["amount_cents"] for c in requests[0]["calls"]] if requests else [],
        "refunds": counts["refunds"],
    }


async def answer_all(h, answer: str) -> dict:
    """Exercise 12.2: one word answers both calls of the approval request."""
    graph, config, thread, customer, requests = await _start(h, ApprovalPolicy(), "ex12-answer")
    state = await graph.ainvoke(resume_command(answer), config)
    replies = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    counts = await _counts(h, thread, customer)
    return {
        "tool_messages": len(replies),
        "rejected": sum(classify(m) == ("failed", "rejected") for m in replies),
        "tools_node_runs": counts["tools_runs"],
        "refunds": counts["refunds"],
        "outbox_rows": counts["outbox_rows"],
    }
