"""Retention with the checkpointer's own prune / delete: old checkpoints go, the ledger and outbox stay."""

from __future__ import annotations

import datetime as dt

import matplotlib
from langchain_core.messages import HumanMessage

from agentlab.core.graph import run_config
from agentlab.core.safeguards import preset
from agentlab.durable.approval import APPROVAL, ApprovalPolicy, pending_requests, resume_command
from agentlab.durable.history import thread_history
from agentlab.durable.retention import (
    RetentionPolicy,
    apply_retention,
    checkpoint_bytes,
    retention_chart,
    retention_experiment,
)
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

matplotlib.use("Agg")

DAY = dt.timedelta(days=1)
POLICY = RetentionPolicy(replayable_for_s=7 * 86400, delete_after_s=90 * 86400)


async def test_retention_removes_old_checkpoints_and_leaves_ledger_and_outbox_intact(harness):
    episodes = [await harness.run_episode("refund", "full", durability="sync") for _ in range(3)]
    threads = [ep.thread_id for ep in episodes]
    ledger = await fetch(harness, "SELECT * FROM tool_executions ORDER BY idempotency_key")
    outbox = await fetch(harness, "SELECT id, status, dedupe_key, provider_ref FROM outbox ORDER BY id")
    before = await checkpoint_bytes(harness.pool, threads)

    # nothing is idle yet: every thread keeps its full history
    now = dt.datetime.now(dt.UTC)
    kept = await apply_retention(harness.saver, harness.pool, POLICY, now=now)
    assert sorted(kept.kept) == sorted(threads) and kept.pruned == kept.deleted == []

    # ten days later: idle threads keep only their latest checkpoint
    pruned = await apply_retention(harness.saver, harness.pool, POLICY, now=now + 10 * DAY)
    assert sorted(pruned.pruned) == sorted(threads)
    after = await checkpoint_bytes(harness.pool, threads)
    assert list(before["checkpoints_rows"]) == [7, 7, 7] and list(after["checkpoints_rows"]) == [1, 1, 1]
    assert all(after["total_bytes"] < before["total_bytes"])
    per_step = pruned.bytes_per_super_step()
    print("\n" + per_step.to_string())
    print(pruned.summary())
    assert (per_step["bytes_per_super_step_after"] < per_step["bytes_per_super_step_before"]).all()
    assert len(retention_chart(pruned).axes[0].patches) == 6  # before and after, three threads

    # a hundred days later: deleted
    deleted = await apply_retention(harness.saver, harness.pool, POLICY, now=now + 100 * DAY)
    assert sorted(deleted.deleted) == sorted(threads)
    assert await scalar(harness, "SELECT count(*) FROM checkpoints") == 0
    assert await scalar(harness, "SELECT count(*) FROM checkpoint_blobs") == 0
    assert await scalar(harness, "SELECT count(*) FROM checkpoint_writes") == 0

    # the ledger and the outbox were never touched
    assert await fetch(harness, "SELECT * FROM tool_executions ORDER BY idempotency_key") == ledger
    assert await fetch(harness, "SELECT id, status, dedupe_key, provider_ref FROM outbox ORDER BY id") == outbox
    assert len(ledger) == 9 and len(outbox) == 3
    assert pruned.ledger_rows == deleted.ledger_rows == (9, 9)
    assert pruned.outbox_rows == deleted.outbox_rows == (3, 3)


async def test_a_thread_waiting_for_approval_is_pruned_but_never_deleted_and_still_resumes(harness):
    sg = preset("full")
    ids = await harness.create_customers(APPROVAL, sg)
    graph = harness.graph(sg, ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=ApprovalPolicy())
    config = run_config("t-waiting", tenant_id="acme")
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config, durability="sync")
    finished = await harness.run_episode("refund", "full", durability="sync")
    now = dt.datetime.now(dt.UTC)

    report = await apply_retention(harness.saver, harness.pool, POLICY, now=now + 200 * DAY)
    assert report.waiting == ["t-waiting"] and report.pruned == ["t-waiting"]
    assert report.deleted == [finished.thread_id]
    assert len(await thread_history(graph, "t-waiting", tenant_id="acme")) == 1
    assert len(await pending_requests(graph, config)) == 1

    state = await graph.ainvoke(resume_command("approve"), config)
    await harness.worker.drain()
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == 2
    assert not state["messages"][-1].tool_calls


async def test_an_active_thread_stays_replayable(harness):
    old = await harness.run_episode("refund", "full", durability="sync")
    fresh = await harness.run_episode("invoice", "full", durability="sync")
    async with harness.pool.connection() as conn:  # the old thread's checkpoints are ten days old
        await conn.execute("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
                           "to_jsonb((now() - interval '10 days')::text)) WHERE thread_id = %s", (old.thread_id,))
    report = await apply_retention(harness.saver, harness.pool, POLICY)
    assert report.kept == [fresh.thread_id] and report.pruned == [old.thread_id]
    counts = dict(await fetch(harness, "SELECT thread_id, count(*) FROM checkpoints GROUP BY 1"))
    assert counts == {fresh.thread_id: 7, old.thread_id: 1}


async def test_a_longer_history_costs_more_and_pruning_keeps_one_checkpoint_per_thread(harness):
    report = await retention_experiment(harness, turns=(1, 8))
    frame = report.bytes_per_super_step()
    print("\n" + frame.to_string())
    assert list(frame["super_steps"]) == [7, 7 + 7 * 3]  # each extra turn: input, agent and the end
    assert frame["bytes_before"].iloc[1] > 3 * frame["bytes_before"].iloc[0]
    assert frame["bytes_after"].iloc[1] > frame["bytes_after"].iloc[0]  # the latest checkpoint holds the history
    assert await scalar(harness, "SELECT count(*) FROM checkpoints") == 2


async def test_retention_chart_shows_the_threads_asked_for_in_their_order_with_their_labels(harness):
    report = await retention_experiment(harness, turns=(1, 3))
    threads = sorted(report.pruned)
    assert len(threads) == 2
    ax = retention_chart(report, threads={threads[1]: "long", threads[0]: "short"}).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["long", "short"]
    assert len(ax.patches) == 4
    heights = [p.get_height() for p in ax.patches]
    frame = report.bytes_per_super_step().set_index("thread_id")
    assert heights[0] == frame.at[threads[1], "bytes_per_super_step_before"]


async def test_a_job_scoped_to_some_threads_leaves_the_others_whole_and_counts_their_rows_only(harness):
    episodes = [await harness.run_episode("refund", "full", durability="sync") for _ in range(3)]
    mine, other = [ep.thread_id for ep in episodes[:2]], episodes[2].thread_id
    later = dt.datetime.now(dt.UTC) + 10 * DAY
    report = await apply_retention(harness.saver, harness.pool, POLICY, now=later, threads=mine)
    assert sorted(report.pruned) == sorted(mine) and report.kept == report.deleted == []
    assert list((await checkpoint_bytes(harness.pool, [other]))["checkpoints_rows"]) == [7]
    assert report.ledger_rows == (6, 6) and report.outbox_rows == (2, 2)  # three calls and one charge per thread
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 9
