"""C33: retention and a thread resumed while it runs.

400 expired threads and an old, finished thread X, every checkpoint 100 days old. Retention
classifies them (X: delete); right then the user returns to X and the run stops on an approval
``interrupt()``. Acting on that classification must leave X alone (its latest checkpoint is newer
than the one it was classified by, and it waits for approval), delete the 400, and the reviewer's
"approve" must still pay. The same holds for a prune.
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from agentlab.core.graph import run_config
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.durable.approval import APPROVAL, ApprovalPolicy, pending_requests, resume_command
from agentlab.durable.history import thread_history
from agentlab.durable.retention import RetentionPolicy, apply_retention
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

EXPIRED = 400
BACKDATE = ("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
            "to_jsonb(((checkpoint ->> 'ts')::timestamptz - %s::interval)::text))")
COLUMNS = ("SELECT string_agg(column_name, ', ' ORDER BY ordinal_position) FROM information_schema.columns "
           "WHERE table_schema = 'public' AND table_name = %s AND column_name <> 'thread_id'")


async def copy_thread(h, source: str, prefix: str, n: int) -> None:
    """``n`` copies of a thread's checkpoint rows under new thread ids (real rows, made fast)."""
    async with h.pool.connection() as conn:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            cols = (await (await conn.execute(COLUMNS, (table,))).fetchone())[0]
            await conn.execute(f"INSERT INTO {table} (thread_id, {cols}) SELECT %s || g, {cols} "
                               f"FROM {table}, generate_series(1, %s) g WHERE thread_id = %s", (prefix, n, source))


async def checkpoints_of(h, thread: str) -> int:
    return await scalar(h, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,))


async def test_c33_retention_leaves_a_thread_resumed_after_classification_alone(harness):
    sg = preset("full")
    ids = await harness.create_customers(APPROVAL, sg)
    x = "thread-x"
    graph = harness.graph(sg, ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=ApprovalPolicy())
    config = run_config(x, tenant_id=APPROVAL.tenant_id)
    chat = harness.graph(sg, ScriptedChatModel(script=[], seed=0, final_text="Hello! How can I help?"))
    await chat.ainvoke({"messages": [HumanMessage("Hi")]}, config, durability="sync")  # X: an old, finished chat
    await copy_thread(harness, x, "expired-", EXPIRED)
    async with harness.pool.connection() as conn:
        await conn.execute(BACKDATE, ("100 days",))

    plan = await apply_retention(harness.saver, harness.pool, RetentionPolicy(), dry_run=True)
    assert len(plan.deleted) == EXPIRED + 1 and x in plan.deleted
    x_before = await checkpoints_of(harness, x)

    # right after the classification the user returns to X; the run stops on an approval
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config, durability="sync")
    x_resumed = await checkpoints_of(harness, x)
    assert x_resumed > x_before and len(await pending_requests(graph, config)) == 1

    report = await apply_retention(harness.saver, harness.pool, RetentionPolicy(), plan=plan)
    assert report.left_alone == [x] and x not in report.deleted and len(report.deleted) == EXPIRED
    assert report.summary()["left_alone"] == 1
    assert await checkpoints_of(harness, x) == x_resumed  # every checkpoint kept
    assert await scalar(harness, "SELECT count(*) FROM checkpoints WHERE thread_id LIKE 'expired-%%'") == 0
    assert await scalar(harness, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id LIKE 'expired-%%'") == 0
    assert await scalar(harness, "SELECT count(*) FROM checkpoint_writes WHERE thread_id LIKE 'expired-%%'") == 0
    assert await fetch(harness, "SELECT status FROM approval_requests WHERE thread_id = %s", (x,)) == [("pending",)]

    refunds_before = await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],))
    state = await graph.ainvoke(resume_command("approve"), config)
    await harness.worker.drain()
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == refunds_before + 2
    assert not state["messages"][-1].tool_calls

    # a new classification sees X waiting: it is pruned at most, never deleted
    later = await apply_retention(harness.saver, harness.pool, RetentionPolicy())
    assert x not in later.deleted


async def test_c33_a_prune_leaves_a_thread_resumed_after_classification_replayable(harness):
    sg, refund = preset("full"), get_scenario("refund")
    ids = await harness.create_customers(refund, sg)
    graph = harness.graph(sg, ScriptedChatModel(script=refund.script(ids), seed=0))
    thread = "thread-p"
    config = run_config(thread, tenant_id=refund.tenant_id)
    await graph.ainvoke({"messages": [HumanMessage(refund.prompt)]}, config, durability="sync")
    async with harness.pool.connection() as conn:
        await conn.execute(BACKDATE, ("10 days",))
    plan = await apply_retention(harness.saver, harness.pool, RetentionPolicy(), dry_run=True)
    assert plan.pruned == [thread]

    await graph.ainvoke({"messages": [HumanMessage("Thanks! Anything else open?")]}, config, durability="sync")
    resumed = await checkpoints_of(harness, thread)

    report = await apply_retention(harness.saver, harness.pool, RetentionPolicy(), plan=plan)
    assert report.pruned == [] and report.left_alone == [thread]
    assert await checkpoints_of(harness, thread) == resumed
    assert len(await thread_history(graph, thread, tenant_id=refund.tenant_id)) == resumed  # every replay point is there
