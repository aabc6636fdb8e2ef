"""Case C15: a tool call whose id is None (Qwen served by vLLM sends ``id: null``, langgraph#4717).

Under ``full`` the call gets a synthetic id derived from its AIMessage's id and position, written back
into the thread: exactly one answer under a string id, the same id on a node retry and on every
resume, nothing applied twice. ``run_batch`` called directly (no AIMessage to derive an id from)
refuses the call by name. A thread left by the old behaviour (the call answered under ``""``) is
repaired instead of raising on every resume."""

from __future__ import annotations

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import MISSING_CALL_ID, SYNTHETIC_ID_PREFIX, unanswered_tool_calls
from agentlab.core.safeguards import preset
from conftest import TurnModel, fetch, scalar

CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"  # acme's customer 1 opens with 5000
LEDGER = "SELECT tool_call_id, occurrence FROM tool_executions WHERE thread_id = %s"


def null_id_call(amount: int = 300) -> AIMessage:
    return AIMessage(content="", tool_calls=[
        {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": amount}, "id": None, "type": "tool_call"}])


def answers(messages) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


async def test_c15_a_call_without_id_runs_once_under_a_stable_synthetic_id(harness):
    node = harness.node(preset("full"))
    lost = []

    def lose_connection_once(calls):  # after COMMIT, before the node returns: the graph retries the node
        if not lost:
            lost.append(1)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    node.hooks.after_commit.append(lose_connection_once)
    graph = build_graph(TurnModel([null_id_call()]), node, checkpointer=harness.saver)
    config = run_config("t-c15", tenant_id="acme")

    state = await graph.ainvoke({"messages": [HumanMessage("Apply 3.00 of credit to customer 1.")]}, config)

    call_id = state["messages"][1].tool_calls[0]["id"]
    assert isinstance(call_id, str) and call_id.startswith(SYNTHETIC_ID_PREFIX)
    assert [(m.tool_call_id, m.artifact["outcome"]) for m in answers(state["messages"])] == [(call_id, "replayed")]
    assert lost == [1]  # the node really was retried after the commit: the retry replayed the stored result
    assert isinstance(state["messages"][-1], AIMessage) and state["messages"][-1].content == "done."
    assert await scalar(harness, CREDIT) == 5000 - 300
    assert await fetch(harness, LEDGER, ("t-c15",)) == [(call_id, 0)]

    for _ in range(2):  # every resume works and finds the same id
        state = await graph.ainvoke(None, config)
        assert state["messages"][1].tool_calls[0]["id"] == call_id
        assert [m.tool_call_id for m in answers(state["messages"])] == [call_id]
    assert unanswered_tool_calls(state["messages"]) == []
    assert await scalar(harness, CREDIT) == 5000 - 300
    assert await fetch(harness, LEDGER, ("t-c15",)) == [(call_id, 0)]


async def test_c15_a_thread_answered_under_an_empty_id_is_repaired_not_stuck(harness):
    """The old node answered the call under ``tool_call_id=""``; the next run must not raise."""
    graph = build_graph(TurnModel([null_id_call(), AIMessage("done.")]), harness.node(preset("full")),
                        checkpointer=harness.saver)
    config = run_config("t-c15-old", tenant_id="acme")
    old_answer = ToolMessage("FAILED [invalid_arguments]: duplicate id", tool_call_id="", name="ApplyCredit",
                             status="error")
    await graph.aupdate_state(config, {"messages": [HumanMessage("Apply credit."), null_id_call(), old_answer]},
                              as_node="tools")

    state = await graph.ainvoke({"messages": [HumanMessage("Anything else?")]}, config)

    ai = next(m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    call_id = ai.tool_calls[0]["id"]
    assert call_id.startswith(SYNTHETIC_ID_PREFIX)
    mine = [m for m in answers(state["messages"]) if m.tool_call_id == call_id]
    assert len(mine) == 1 and mine[0].artifact["outcome"] == "not_applied"
    assert unanswered_tool_calls(state["messages"]) == []
    assert await scalar(harness, CREDIT) == 5000  # it never ran
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_c15_run_batch_refuses_a_call_without_id_by_name(harness):
    node = harness.node(preset("full"))
    batch = await node.run_batch(null_id_call().tool_calls + [
        {"name": "LookupCustomer", "args": {"customer_id": 1}, "id": None, "type": "tool_call"}],
        thread_id="t-c15-direct", tenant_id="acme")

    # one answer per distinct id, the missing one included: the two calls share the answer under ""
    assert [(r.call_id, r.outcome.value) for r in batch.results] == [("", "failed")]
    assert [m.content for m in batch.messages] == [f"FAILED [invalid_arguments]: {MISSING_CALL_ID}"]
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
