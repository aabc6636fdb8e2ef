"""Case C16: tool calls whose arguments are not valid JSON (LangChain puts them in
``AIMessage.invalid_tool_calls``, LibreChat-AI/agents#366).

Every invalid call gets one ``FAILED [invalid_arguments]`` saying the arguments are not valid JSON,
nothing of it is applied, the batch policy applies to its siblings (atomic: NOT APPLIED, partial: they
run), and the model gets another turn. Orphan repair answers an unanswered invalid call too."""

from __future__ import annotations

import dataclasses

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import FAILED_TEMPLATE, INVALID_JSON_ARGUMENTS, NOT_APPLIED_PREFIX, unanswered_tool_calls
from agentlab.core.safeguards import Policy, preset
from conftest import TurnModel, scalar

FAILED_JSON = FAILED_TEMPLATE.format(category="invalid_arguments", reason=INVALID_JSON_ARGUMENTS)
BROKEN = '{"customer_id": 1, "amount_cents": 25'
LEDGER_ROWS = "SELECT count(*) FROM tool_executions"
CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"


def invalid_call(call_id: str = "call_bad") -> dict:
    return {"name": "ApplyCredit", "args": BROKEN, "id": call_id, "error": "Function ApplyCredit arguments are not valid JSON",
            "type": "invalid_tool_call"}


def lookup(call_id: str = "call_look") -> dict:
    return {"name": "LookupCustomer", "args": {"customer_id": 1}, "id": call_id, "type": "tool_call"}


def answers(messages) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


async def test_c16_a_only_call_invalid_is_answered_and_the_model_gets_another_turn(harness):
    model = TurnModel([AIMessage(content="", invalid_tool_calls=[invalid_call()])])
    graph = build_graph(model, harness.node(preset("full")), checkpointer=harness.saver)

    state = await graph.ainvoke({"messages": [HumanMessage("Apply 0.25 of credit.")]},
                                run_config("t-c16-a", tenant_id="acme"))

    got = answers(state["messages"])
    assert list(got) == ["call_bad"]
    assert got["call_bad"].content == FAILED_JSON and got["call_bad"].status == "error"
    assert model.calls == 2  # a second turn, which saw the answer
    assert state["messages"][-1].content == "done."
    assert unanswered_tool_calls(state["messages"]) == []
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, LEDGER_ROWS) == 0


async def test_c16_b_atomic_policy_rolls_the_valid_sibling_back(harness):
    model = TurnModel([AIMessage(content="", tool_calls=[lookup()], invalid_tool_calls=[invalid_call()])])
    graph = build_graph(model, harness.node(preset("full")), checkpointer=harness.saver)

    state = await graph.ainvoke({"messages": [HumanMessage("Look up and credit.")]},
                                run_config("t-c16-b", tenant_id="acme"))

    got = answers(state["messages"])
    assert sorted(got) == ["call_bad", "call_look"]
    assert got["call_bad"].content == FAILED_JSON
    assert got["call_look"].content.startswith(NOT_APPLIED_PREFIX)
    assert model.calls == 2
    assert await scalar(harness, LEDGER_ROWS) == 0


async def test_c16_b_partial_policy_runs_the_valid_sibling(harness):
    partial = dataclasses.replace(preset("full"), policy=Policy.PARTIAL)
    batch = await harness.node(partial).run_batch([lookup()], invalid_tool_calls=[invalid_call()],
                                                  thread_id="t-c16-p", tenant_id="acme")

    assert [(r.call_id, r.outcome.value) for r in batch.results] == [("call_look", "applied"), ("call_bad", "failed")]
    assert batch.messages[1].content == FAILED_JSON
    assert await scalar(harness, "SELECT tool_call_id FROM tool_executions") == "call_look"
    assert await scalar(harness, CREDIT) == 5000


async def test_c16_orphan_repair_sees_an_unanswered_invalid_call(harness):
    graph = build_graph(TurnModel([]), harness.node(preset("full")), checkpointer=harness.saver)
    config = run_config("t-c16-o", tenant_id="acme")
    history = [HumanMessage("Look up and credit."),
               AIMessage(content="", tool_calls=[lookup()], invalid_tool_calls=[invalid_call()]),
               ToolMessage('{"customer_id": 1}', tool_call_id="call_look", name="LookupCustomer")]
    await graph.aupdate_state(config, {"messages": history}, as_node="tools")
    assert unanswered_tool_calls((await graph.aget_state(config)).values["messages"]) == ["call_bad"]

    state = await graph.ainvoke({"messages": [HumanMessage("Anything else?")]}, config)

    got = answers(state["messages"])
    assert got["call_bad"].content == FAILED_JSON
    assert unanswered_tool_calls(state["messages"]) == []
    assert await scalar(harness, LEDGER_ROWS) == 0
