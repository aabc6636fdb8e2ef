"""Case C02: a checkpointed thread whose last AIMessage has 2 tool call ids and only 1 ToolMessage,
then a new user message. Before the next model call the orphan is answered; the model never
receives an unanswered tool call. Through a real graph with the real AsyncPostgresSaver."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic import PrivateAttr

from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import NOT_APPLIED_PREFIX, ORPHANED_CALL, unanswered_tool_calls
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import idempotency_key
from agentlab.sim.model import ScriptedChatModel
from conftest import scalar


class RecordingModel(ScriptedChatModel):
    """The scripted model, recording every message list it is called with."""

    _seen: list = PrivateAttr(default_factory=list)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self._seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def orphaned_history(customer_id: int) -> list:
    return [
        HumanMessage("Apply 3.00 of credit and look the customer up."),
        AIMessage(content="", tool_calls=[
            {"name": "ApplyCredit", "args": {"customer_id": customer_id, "amount_cents": 300}, "id": "call_a",
             "type": "tool_call"},
            {"name": "LookupCustomer", "args": {"customer_id": customer_id}, "id": "call_b", "type": "tool_call"},
        ]),
        ToolMessage('{"customer_id":1}', tool_call_id="call_b", name="LookupCustomer"),  # call_a never answered
    ]


async def checkpointed_thread(harness, thread_id: str, customer_id: int):
    model = RecordingModel(script=[], seed=0)
    graph = build_graph(model, harness.node(preset("full")), checkpointer=harness.saver)
    config = run_config(thread_id, tenant_id="acme")
    await graph.aupdate_state(config, {"messages": orphaned_history(customer_id)}, as_node="tools")
    saved = (await graph.aget_state(config)).values["messages"]
    assert unanswered_tool_calls(saved) == ["call_a"]  # the checkpoint really holds the orphan
    return graph, model, config


async def test_c02_orphan_is_answered_not_applied_before_the_next_model_call(harness):
    graph, model, config = await checkpointed_thread(harness, "t-c02", 1)
    state = await graph.ainvoke({"messages": [HumanMessage("Anything else to do?")]}, config)

    assert len(model._seen) == 1
    received = model._seen[0]
    assert unanswered_tool_calls(received) == []  # 0 orphan ids reach the model
    answers = [m for m in received if isinstance(m, ToolMessage) and m.tool_call_id == "call_a"]
    assert len(answers) == 1 and answers[0].content.startswith(NOT_APPLIED_PREFIX)
    assert ORPHANED_CALL in answers[0].content
    # the answer sits with its AIMessage, before the new user message
    assert received.index(answers[0]) < max(i for i, m in enumerate(received) if isinstance(m, HumanMessage))
    # the run went on, and the thread's saved history is repaired too
    final = state["messages"]
    assert isinstance(final[-1], AIMessage) and not final[-1].tool_calls
    assert unanswered_tool_calls((await graph.aget_state(config)).values["messages"]) == []
    ids = [m.tool_call_id for m in final if isinstance(m, ToolMessage)]
    assert sorted(ids) == ["call_a", "call_b"]
    # nothing was applied for the orphan
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1") == 5000


async def test_c02_orphan_that_committed_is_answered_with_its_stored_result(harness):
    """The orphan's batch had committed before the crash: the ledger's result answers it, nothing runs twice."""
    node = harness.node(preset("full"))
    first = await node.run_batch([{"name": "ApplyCredit", "args": {"customer_id": 2, "amount_cents": 300},
                                   "id": "call_a", "type": "tool_call"}], thread_id="t-c02-b", tenant_id="acme")
    graph, model, config = await checkpointed_thread(harness, "t-c02-b", 2)
    await graph.ainvoke({"messages": [HumanMessage("Anything else to do?")]}, config)

    received = model._seen[0]
    assert unanswered_tool_calls(received) == []
    answer = next(m for m in received if isinstance(m, ToolMessage) and m.tool_call_id == "call_a")
    assert answer.content == first.results[0].content
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 2") == 12000 - 300
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE idempotency_key = %s",
                        (idempotency_key("t-c02-b", "call_a", tenant_id="acme"),)) == 1
