"""Case C25: replaying with the config LangGraph hands back.

``graph.get_state_history(config)`` gives snapshots whose config holds only the thread and the
checkpoint; ``ainvoke(None, snapshot.config)`` is how LangGraph documents replay. Under ``full`` that
raised ``TenantRequired``. Now the tenant comes from the thread's own record (``thread_tenants``,
bound by its first batch), never from the model, and the ledger replays the stored results."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.isolation import TenantMismatch, TenantRequired
from agentlab.core.safeguards import preset
from conftest import TurnModel, fetch, scalar

CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"  # opens with 5000


def apply_credit() -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 400},
                                              "id": "call_c25", "type": "tool_call"}])


async def test_c25_replay_from_a_snapshot_config_replays_the_ledger(harness):
    graph = build_graph(TurnModel([apply_credit()]), harness.node(preset("full")), checkpointer=harness.saver)
    config = run_config("t-c25", tenant_id="acme")
    await graph.ainvoke({"messages": [HumanMessage("Apply 4.00 of credit.")]}, config)
    assert await scalar(harness, CREDIT) == 4600

    history = [s async for s in graph.aget_state_history(config)]
    before_tools = next(s for s in history if s.next == ("tools",))
    assert "tenant_id" not in before_tools.config["configurable"]  # what LangGraph hands back
    state = await graph.ainvoke(None, before_tools.config)

    answers = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.artifact["outcome"]) for m in answers] == [("call_c25", "replayed")]
    assert state["messages"][-1].content == "done."
    assert await scalar(harness, CREDIT) == 4600
    assert await fetch(harness, "SELECT tenant_id, tool_call_id FROM tool_executions") == [("acme", "call_c25")]
    assert await fetch(harness, "SELECT tenant_id FROM thread_tenants WHERE thread_id = 't-c25'") == [("acme",)]


async def test_c25_a_thread_never_runs_for_another_tenant_and_an_unknown_one_still_needs_a_tenant(harness):
    graph = build_graph(TurnModel([apply_credit(), AIMessage("done."), apply_credit()]), harness.node(preset("full")), checkpointer=harness.saver)
    await graph.ainvoke({"messages": [HumanMessage("Apply 4.00 of credit.")]}, run_config("t-c25-b", tenant_id="acme"))

    with pytest.raises(TenantMismatch):
        await graph.ainvoke({"messages": [HumanMessage("Again.")]}, run_config("t-c25-b", tenant_id="globex"))
    with pytest.raises(TenantRequired):  # a thread with no record and no configured tenant
        await graph.ainvoke({"messages": [HumanMessage("Apply.")]}, {"configurable": {"thread_id": "t-c25-new"}})
    assert await scalar(harness, CREDIT) == 4600
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 1
