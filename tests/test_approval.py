"""Human approval with interrupt() on a real PostgreSQL and the real Postgres checkpointer (C05, C06)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.errors import SimulatedCrash
from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
from agentlab.durable.approval import (
    APPROVAL,
    REJECTED_MESSAGE,
    ApprovalPolicy,
    interrupts_of,
    pending_requests,
    resume_command,
    resume_days_later,
)
from agentlab.sim.model import ScriptedChatModel, classify
from agentlab.sim.provider import customer_ref
from conftest import fetch, scalar

DAY_S = 86400


async def start(h, scenario=APPROVAL, policy=None, thread="t-approval"):
    """Play ``scenario`` with an approval step until it stops; return graph, config, ids, tools node, result."""
    policy = policy if policy is not None else ApprovalPolicy()
    sg = preset("full")
    ids = await h.create_customers(scenario, sg)
    node = h.node(sg)
    graph = build_graph(ScriptedChatModel(script=scenario.script(ids), seed=0), node, checkpointer=h.saver,
                        approval=policy)
    config = run_config(thread, tenant_id=scenario.tenant_id)
    result = await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]}, config)
    return graph, config, ids, node, result


async def test_c05_approval_node_runs_twice_and_its_pending_row_exists_once(harness):
    graph, config, ids, _, result = await start(harness)
    (request,) = interrupts_of(result)
    assert await fetch(harness, "SELECT request_key, status FROM approval_requests") == [
        (request["request_key"], "pending")]

    await graph.ainvoke(resume_command("approve"), config)
    await harness.events.flush()

    runs = await fetch(harness, "SELECT outcome FROM events WHERE kind = 'node' AND node = 'approve' ORDER BY id")
    assert runs == [("interrupted",), ("ok",)]  # the node body ran twice
    rows = await fetch(harness, "SELECT request_key, status, decisions FROM approval_requests")
    assert len(rows) == 1 and rows[0][0] == request["request_key"]
    assert request["request_key"].startswith("t-approval:approve:2:")  # thread, node, super-step, checkpoint
    assert rows[0][1] == "decided"
    assert set(rows[0][2].values()) == {"approve"}


async def test_c06_reject_the_first_approve_the_second(harness):
    graph, config, ids, _, result = await start(harness)
    (request,) = interrupts_of(result)
    assert [c["args"]["reference"] for c in request["calls"]] == ["RMA-3001", "RMA-3002"]  # one request, both calls
    first, second = (c["tool_call_id"] for c in request["calls"])

    state = await graph.ainvoke(resume_command({first: "reject", second: "approve"}), config)
    await harness.worker.drain()

    messages = state["messages"]
    replies = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert len(replies) == 2 and sum(isinstance(m, ToolMessage) for m in messages) == 2
    assert replies[first].content == REJECTED_MESSAGE and classify(replies[first]) == ("failed", "rejected")
    assert classify(replies[second])[0] == "ok"
    assert unanswered_tool_calls(messages) == []
    assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls  # the next model call was accepted
    assert sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage)) == 2  # the rejected call was dropped

    refunds = await fetch(harness, "SELECT reference FROM refunds WHERE customer_id = %s", (ids[0],))
    assert refunds == [("RMA-3002",)]
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s",
                        (customer_ref(ids[0]),)) == 1


async def test_approval_resumed_three_days_later_refunds_exactly_once(harness):
    graph, config, ids, node, result = await start(harness)
    assert len(interrupts_of(result)) == 1
    assert await scalar(harness, "SELECT count(*) FROM outbox") == 0  # nothing before the approval

    node_crash = {"armed": True}

    def die_after_commit(calls):  # the process dies after the business commit, before the checkpoint
        if node_crash.pop("armed", False):
            raise SimulatedCrash("process died after COMMIT")

    harness.provider.clock.advance(3 * DAY_S)  # the reviewer answers three days later
    node.hooks.after_commit.append(die_after_commit)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke(resume_command("approve"), config)
    assert await scalar(harness, "SELECT count(*) FROM refunds") == 2  # committed before the crash

    worker_crash = {"armed": True}

    def die_after_provider_call(row_id):  # the worker dies after the provider paid, before marking the row
        if worker_crash.pop("armed", False):
            raise SimulatedCrash("worker died after the provider call")

    harness.worker.hooks.after_provider_call.append(die_after_provider_call)
    with pytest.raises(SimulatedCrash):
        await harness.worker.run_once()
    assert await scalar(harness, "SELECT count(*) FROM outbox WHERE status = 'pending'") == 2

    harness.provider.clock.advance(3 * DAY_S)  # the provider has forgotten every key it saw
    state = await graph.ainvoke(None, config)  # the thread resumes: the tools node runs again
    drain = await harness.worker.drain()

    assert unanswered_tool_calls(state["messages"]) == []
    await harness.events.flush()
    assert await fetch(harness, "SELECT outcome, error_class FROM events WHERE kind = 'node' AND node = 'tools' "
                                "ORDER BY id") == [("error", "agentlab.core.errors.SimulatedCrash"), ("ok", None)]
    # the re-run answered from the ledger; the crashed run's applied events, never written, were rebuilt
    # from the ledger rows by the flush (C38)
    assert await fetch(harness, "SELECT outcome, count(*) FROM events WHERE kind = 'call' GROUP BY 1 ORDER BY 1") == [
        ("applied", 2), ("replayed", 2)]
    assert await scalar(harness, "SELECT count(*) FROM refunds") == 2
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 2
    assert await fetch(harness, "SELECT status, count(*) FROM outbox GROUP BY status") == [("dispatched", 2)]
    payments = await fetch(harness, "SELECT reference, count(*) FROM provider.payments GROUP BY reference ORDER BY 1")
    assert [n for _, n in payments] == [1, 1]  # exactly one refund per approved call
    assert drain.reconciled == 1  # the one the crashed worker had paid was found by its reference


async def test_a_refund_under_the_threshold_needs_no_approval(harness):
    small = Scenario(
        name="small_refund", title="", prompt="Refund order RMA-4001 worth 50.00.",
        customers=(CustomerSpec("acme", "Small refunds", 0),),
        steps=((PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-4001", "amount_cents": 5000}),),),
        intended=Intended(final_credit_cents=(0,)),
    )
    _, _, ids, _, result = await start(harness, small)
    assert interrupts_of(result) == []
    assert await scalar(harness, "SELECT count(*) FROM approval_requests") == 0
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == 1


async def test_rejecting_every_call_skips_the_tools_node(harness):
    graph, config, ids, _, result = await start(harness)
    assert len(await pending_requests(graph, config)) == 1
    state = await graph.ainvoke(resume_command("reject"), config)
    await harness.events.flush()
    assert [classify(m)[1] for m in state["messages"] if isinstance(m, ToolMessage)] == ["rejected", "rejected"]
    assert await scalar(harness, "SELECT count(*) FROM events WHERE kind = 'node' AND node = 'tools'") == 0
    assert await scalar(harness, "SELECT count(*) FROM refunds") == 0
    assert await pending_requests(graph, config) == []


async def test_each_replayed_branch_gets_its_own_approval_request(harness):
    from agentlab.durable.history import find_checkpoint, replay, thread_history

    graph, config, ids, _, result = await start(harness)
    await graph.ainvoke(resume_command("approve"), config)
    history = await thread_history(graph, "t-approval", tenant_id="acme")
    before_approve = find_checkpoint(history, next_node="approve")
    for _ in range(2):  # two sibling branches from the same checkpoint
        again = await replay(graph, "t-approval", before_approve, tenant_id="acme")
        assert len(interrupts_of(again)) == 1
    rows = await fetch(harness, "SELECT status, count(*) FROM approval_requests GROUP BY 1 ORDER BY 1")
    assert rows == [("decided", 1), ("pending", 2)]
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == 2


async def test_resume_days_later_story_refunds_each_approved_call_once(harness):
    report = await resume_days_later(harness, days=3, thread_id="t-late")
    assert report == {
        "requests": 1, "refund_rows": 2, "ledger_rows": 2, "outbox_dispatched": 2, "calls_replayed": 2,
        "tools_node_runs": ["error (SimulatedCrash)", "ok"], "reconciled": 1,
        "provider_refunds": {"RMA-3001": 1, "RMA-3002": 1},
    }
    assert harness.provider.clock.offset.days == 6
    # read again, independently of the function: the provider's own records
    assert await fetch(harness, "SELECT kind, count(*) FROM provider.payments GROUP BY kind") == [("refund", 2)]
    assert await scalar(harness, "SELECT count(*) FROM approval_requests WHERE status = 'decided'") == 1
    assert harness.worker.hooks.after_provider_call == []  # the worker runs normally afterwards
