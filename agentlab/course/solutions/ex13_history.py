"""Exercises of notebook 13 (checkpoints, replay, forks and retention)."""

from __future__ import annotations

import datetime as dt
import uuid

from langchain_core.messages import HumanMessage

from agentlab import (
    APPROVAL,
    ApprovalPolicy,
    RetentionPolicy,
    ScriptedChatModel,
    apply_retention,
    get_scenario,
    pending_requests,
    preset,
    resume_command,
    run_config,
    thread_counts,
    thread_history,
)

POLICY = RetentionPolicy(replayable_for_s=7 * 86400, delete_after_s=90 * 86400)


def _action(report, thread: str) -> str:
    return "deleted" if thread in report.deleted else "pruned" if thread in report.pruned else "kept"


async def history_after_retention(h, idle_days: float) -> dict:
    """Exercise 13.1: the refund story, then the retention job ``idle_days`` later."""
    scenario, sg = get_scenario("refund"), preset("full")
    ids = await h.create_customers(scenario, sg)
    graph = h.graph(sg, ScriptedChatModel(script=scenario.script(ids), seed=0))
    thread = f"ex13-history-{uuid.uuid4().hex[:12]}"
    await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]},
                        run_config(thread, tenant_id=scenario.tenant_id), durability="sync")
    await h.worker.drain()
    before = await thread_history(graph, thread, tenant_id=scenario.tenant_id)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=idle_days)
    report = await apply_retention(h.saver, h.pool, POLICY, now=later)
    after = await thread_history(graph, thread, tenant_id=scenario.tenant_id)
    counts = await thread_counts(h.pool, thread, ids)

    def before_tools(history) -> int:
        return int(history["next"].apply(lambda n: "tools" in n).sum())

    return {
        "action": _action(report, thread),
        "checkpoints": [len(before), len(after)],
        "replay_points_before_tools": [before_tools(before), before_tools(after)],
        "ledger_rows": counts["ledger_rows"],
        "outbox_rows": counts["outbox_rows"],
    }


async def waiting_thread_survives(h, idle_days: float = 200) -> dict:
    """Exercise 13.2: a thread waiting for approval and a finished one, ``idle_days`` later."""
    sg = preset("full")
    ids = await h.create_customers(APPROVAL, sg)
    graph = h.graph(sg, ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=ApprovalPolicy())
    waiting = f"ex13-waiting-{uuid.uuid4().hex[:12]}"
    config = run_config(waiting, tenant_id=APPROVAL.tenant_id)
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config, durability="sync")
    finished = await h.run_episode("refund", sg, durability="sync")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=idle_days)
    report = await apply_retention(h.saver, h.pool, POLICY, now=later)
    left = len(await thread_history(graph, waiting, tenant_id=APPROVAL.tenant_id))
    pending = len(await pending_requests(graph, config))
    await graph.ainvoke(resume_command("approve"), config)
    await h.worker.drain()
    refunds = (await h.df("SELECT count(*) AS n FROM refunds WHERE customer_id = %s", (ids[0],))).n[0]
    return {
        "waiting_thread": _action(report, waiting),
        "finished_thread": _action(report, finished.thread_id),
        "checkpoints_left": left,
        "pending_requests": pending,
        "refunds_after_resume": int(refunds),
    }
