"""Case C24: the same refused call, again and again, between other calls.

A model sends ``ApplyCredit(customer_id="7'")`` (refused), then a successful ``LookupCustomer``, then
the refused call again, alternating forever. Escalation used to count only consecutive rolled-back
batches, so the run ended in ``GraphRecursionError``. Now the same refused call (same tool, same
arguments, whatever ids and whatever lies between) coming back ``max_refusals`` times in one run
escalates."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.graph import MAX_REPEATED_REFUSALS, build_graph, run_config
from agentlab.core.safeguards import preset
from conftest import TurnModel, scalar


def alternate(messages) -> AIMessage:
    n = sum(isinstance(m, AIMessage) for m in messages)
    if n % 2 == 0:
        call = {"name": "ApplyCredit", "args": {"customer_id": "7'", "amount_cents": 100}}
    else:
        call = {"name": "LookupCustomer", "args": {"customer_id": 1}}
    return AIMessage(content="", tool_calls=[{**call, "id": f"call_{n}", "type": "tool_call"}])


async def test_c24_the_same_refused_call_between_other_calls_escalates(harness):
    credit_before = await scalar(harness, "SELECT sum(credit_cents) FROM customers")
    model = TurnModel([alternate] * 100)
    graph = build_graph(model, harness.node(preset("full")), checkpointer=harness.saver)

    state = await graph.ainvoke({"messages": [HumanMessage("Apply 1.00 to customer 7.")]},
                                run_config("t-c24", tenant_id="acme"))  # the recursion limit is 60

    assert state["escalated"] is True
    assert state["escalation_reason"] == f"the same refused ApplyCredit call came back {MAX_REPEATED_REFUSALS} times in this run"
    refused = [m for m in state["messages"] if isinstance(m, ToolMessage) and m.name == "ApplyCredit"]
    assert len(refused) == MAX_REPEATED_REFUSALS and all(m.content.startswith("FAILED [invalid_arguments]")
                                                         for m in refused)
    assert model.calls == 2 * MAX_REPEATED_REFUSALS - 1  # refused, lookup, refused, lookup, refused: stop
    assert await scalar(harness, "SELECT sum(credit_cents) FROM customers") == credit_before
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE tool_name = 'ApplyCredit'") == 0


async def test_c24_a_new_user_turn_starts_a_new_count(harness):
    model = TurnModel([alternate] * 100)
    graph = build_graph(model, harness.node(preset("full")), checkpointer=harness.saver, max_refusals=2)
    config = run_config("t-c24-b", tenant_id="acme")
    await graph.ainvoke({"messages": [HumanMessage("Apply 1.00 to customer 7.")]}, config)
    calls_first_run = model.calls

    state = await graph.ainvoke({"messages": [HumanMessage("Try again.")]}, config)

    # the new run (lookup, refused, lookup, refused) is stopped by its own 2 refusals, not at once by the
    # first run's 2
    assert calls_first_run == 3 and model.calls - calls_first_run == 4
    since = max(i for i, m in enumerate(state["messages"]) if isinstance(m, HumanMessage))
    assert [m.name for m in state["messages"][since:] if isinstance(m, ToolMessage)] == [
        "LookupCustomer", "ApplyCredit", "LookupCustomer", "ApplyCredit"]
    assert state["escalation_reason"] == "the same refused ApplyCredit call came back 2 times in this run"
