"""Checkpoints, replay and forks with the real AsyncPostgresSaver: what re-executes, what protects the data."""

from __future__ import annotations

from langchain_core.messages import HumanMessage

from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.durable.history import (
    edit_tool_call,
    find_checkpoint,
    fork,
    replay,
    replay_and_fork_experiment,
    run_from,
    thread_config,
    thread_counts,
    thread_history,
)
from agentlab.sim.model import ScriptedChatModel

REFUND = get_scenario("refund")


async def play(h, policy: str = "atomic", thread: str = "t-history"):
    sg = preset("full").replace(policy=policy)
    ids = await h.create_customers(REFUND, sg)
    graph = h.graph(sg, ScriptedChatModel(script=REFUND.script(ids), seed=0))
    await graph.ainvoke({"messages": [HumanMessage(REFUND.prompt)]}, thread_config(thread, tenant_id="acme"),
                        durability="sync")
    await h.worker.drain()
    await h.events.flush()
    return graph, ids


async def test_thread_history_lists_every_super_step(harness):
    graph, ids = await play(harness)
    history = await thread_history(graph, "t-history", tenant_id="acme")
    assert list(history["step"]) == [-1, 0, 1, 2, 3, 4, 5]
    assert [n for n in history["next"]] == [("__start__",), ("agent",), ("tools",), ("agent",), ("tools",),
                                            ("agent",), ()]
    assert list(history["tool_calls"]) == [0, 0, 3, 0, 3, 0, 0]
    counts = await thread_counts(harness.pool, "t-history", ids)
    assert counts["checkpoints"] == len(history) == 7
    assert (counts["ledger_rows"], counts["credit_memos"], counts["refunds"], counts["credit_cents"]) == (3, 1, 1, 2500)


async def test_replay_before_tools_reuses_the_tool_call_ids_and_the_ledger_answers(harness):
    graph, ids = await play(harness)
    history = await thread_history(graph, "t-history", tenant_id="acme")
    before = await thread_counts(harness.pool, "t-history", ids)
    state = await replay(graph, "t-history", find_checkpoint(history, next_node="tools"), tenant_id="acme")
    await harness.worker.drain()
    await harness.events.flush()
    after = await thread_counts(harness.pool, "t-history", ids)
    assert after["node_executions"] - before["node_executions"] == 2  # tools and agent re-ran
    assert after["checkpoints"] > before["checkpoints"]  # a new branch of the same thread
    for name in ("ledger_rows", "outbox_rows", "credit_memos", "refunds", "credit_cents", "provider_payments"):
        assert after[name] == before[name], name
    replayed = [m.artifact["outcome"] for m in state["messages"][-4:-1]]
    assert replayed == ["replayed"] * 3


async def test_replay_before_agent_mints_new_ids_so_only_natural_keys_protect(harness):
    graph, ids = await play(harness, policy="partial")
    history = await thread_history(graph, "t-history", tenant_id="acme")
    before = await thread_counts(harness.pool, "t-history", ids)
    await replay(graph, "t-history", find_checkpoint(history, next_node="agent", occurrence=0), tenant_id="acme")
    await harness.worker.drain()
    after = await thread_counts(harness.pool, "t-history", ids)
    assert (after["credit_memos"], after["refunds"]) == (1, 1)  # natural keys held
    assert after["provider_payments"] == 1
    assert after["ledger_rows"] - before["ledger_rows"] == 1  # the new id of ApplyCredit: applied again
    assert after["credit_cents"] == before["credit_cents"] - 2500  # no natural key: deducted twice


async def test_fork_that_edits_a_call_but_keeps_its_id_is_refused_by_the_ledger(harness):
    graph, ids = await play(harness)
    history = await thread_history(graph, "t-history", tenant_id="acme")
    cp = find_checkpoint(history, next_node="tools")
    snap = await graph.aget_state(thread_config("t-history", cp, tenant_id="acme"))
    edited = edit_tool_call(snap.values["messages"][-1], "QueueRefund", amount_cents=2000)
    config = await fork(graph, "t-history", cp, {"messages": [edited]}, as_node="agent", tenant_id="acme")
    state = await run_from(graph, config)
    await harness.worker.drain()
    refund = [m for m in state["messages"] if getattr(m, "name", None) == "QueueRefund"][-1]
    # the ledger keeps the call's arguments: the same id with another amount is a conflict, not a replay
    assert refund.content.startswith("FAILED [conflict]: this tool call id was already applied with other")
    assert refund.artifact["outcome"] == "failed"
    counts = await thread_counts(harness.pool, "t-history", ids)
    assert (counts["refunds"], counts["ledger_rows"], counts["provider_payments"]) == (1, 3, 1)


async def test_replay_and_fork_experiment_reports_database_deltas(harness):
    frame = await replay_and_fork_experiment(harness)
    print(frame.to_string())
    by = {(a, p): row for a, p, row in zip(frame["action"], frame["policy"], frame.to_dict("records"))}
    assert by[("replay before tools (same ids)", "atomic")]["d_ledger_rows"] == 0
    assert by[("replay before agent (model re-runs)", "partial")]["d_credit_cents"] == -2500
    assert by[("replay before agent (model re-runs)", "atomic")]["escalated"]
    assert all(frame["d_refunds"] == 0) and all(frame["d_credit_memos"] == 0) and all(frame["d_provider_payments"] == 0)
