"""Case C17: tool call ids reused across turns (llama.cpp sends one constant id; Kimi numbers calls
``functions.NAME:0`` from 0 on every round: NousResearch/hermes-agent#70724, open-webui#28305).

The kit accepts reused ids: the ledger key holds the call's occurrence (how many earlier AIMessages
of the thread hold the id). Three turns each sending ``ApplyCredit`` under ``functions.ApplyCredit:0``
are three calls, all applied; a node retry inside a turn and a resume after a crash inside a turn are
the same call again and replay the stored result."""

from __future__ import annotations

import json

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.errors import SimulatedCrash
from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.safeguards import preset
from conftest import TurnModel, fetch, scalar

REUSED = "functions.ApplyCredit:0"
CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"  # opens with 5000


def apply_credit(amount: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": amount},
                                              "id": REUSED, "type": "tool_call"}])


def reply_to_last_user(messages) -> AIMessage:
    """Each user turn: one ApplyCredit with the constant id, then a closing text once it is answered."""
    last = messages[-1]
    if isinstance(last, HumanMessage):
        return apply_credit(int(last.content.split()[1]))
    return AIMessage("done.")


async def test_c17_three_turns_reusing_one_id_are_three_applied_calls(harness):
    node = harness.node(preset("full"))
    graph = build_graph(TurnModel([reply_to_last_user] * 10), node, checkpointer=harness.saver)
    config = run_config("t-c17", tenant_id="acme")
    commits: list[int] = []

    def fail_after_commit(calls):  # runs once per batch that applied something
        commits.append(calls[0]["args"]["amount_cents"])
        if len(commits) == 2:  # turn 2: the connection is lost before the node returns; the graph retries it
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        if len(commits) == 3:  # turn 3: the process dies before the checkpoint
            raise SimulatedCrash("process died after COMMIT")

    node.hooks.after_commit.append(fail_after_commit)

    await graph.ainvoke({"messages": [HumanMessage("apply 1000")]}, config)
    await graph.ainvoke({"messages": [HumanMessage("apply 1000")]}, config)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke({"messages": [HumanMessage("apply 700")]}, config)
    assert await scalar(harness, CREDIT) == 5000 - 1000 - 1000 - 700  # turn 3 committed before the crash
    state = await graph.ainvoke(None, config)  # resume: the tools node re-runs turn 3's batch

    assert commits == [1000, 1000, 700]  # the retry and the resume applied nothing again
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == [REUSED] * 3
    # turn 1 applied; turn 2's answer comes from its retry (replayed), turn 3's from the resume (replayed)
    assert [m.artifact["outcome"] for m in tool_messages] == ["applied", "replayed", "replayed"]
    assert all(m.status == "success" for m in tool_messages)
    assert [json.loads(m.content)["remaining_credit_cents"] for m in tool_messages] == [4000, 3000, 2300]
    assert unanswered_tool_calls(state["messages"]) == []
    assert await scalar(harness, CREDIT) == 2300
    assert await fetch(harness, "SELECT tool_call_id, occurrence, args->>'amount_cents' FROM tool_executions "
                                "WHERE thread_id = 't-c17' ORDER BY occurrence") == [
        (REUSED, 0, "1000"), (REUSED, 1, "1000"), (REUSED, 2, "700")]
