"""Approve, edit, reject per call (issue 29 item 1), on a real PostgreSQL and the real Postgres checkpointer.

An edit is validated by the tool's strict argument model, bound to the call the reviewer saw (its
``args_sha256``) and recorded with who decided and when; the call that runs is exactly the edited one (the
ledger's arguments hash to the recorded hash). A rejection carries the reviewer's reason to the model.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.errors import SimulatedCrash
from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
from agentlab.durable.approval import (
    REJECTED_MESSAGE,
    ApprovalPolicy,
    approval_decisions,
    args_hash,
    edit_call,
    interrupts_of,
    reject_call,
    resume_command,
)
from agentlab.sim.model import ScriptedChatModel, classify
from conftest import fetch, scalar

DAY_S = 86400
REFUND = Scenario(
    name="one-refund-to-edit", title="one refund above the threshold",
    prompt="Refund RMA-9, 150.00, to the card.",
    customers=(CustomerSpec("acme", "Acme Outfitters", 0),),
    steps=((PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-9", "amount_cents": 15000}),),),
    intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), invoices=(0,),
                      credit_memos=(0,), provider_charges=(0,)),
)
DECIDED = "SELECT status, decisions, decision_details, decided_by, decided_at IS NOT NULL FROM approval_requests"


async def waiting(h, thread: str):
    sg = preset("full")
    ids = await h.create_customers(REFUND, sg)
    node = h.node(sg)
    graph = build_graph(ScriptedChatModel(script=REFUND.script(ids), seed=0), node, checkpointer=h.saver,
                        approval=ApprovalPolicy())
    config = run_config(thread, tenant_id=REFUND.tenant_id)
    (request,) = interrupts_of(await graph.ainvoke({"messages": [HumanMessage(REFUND.prompt)]}, config))
    return graph, config, node, ids[0], request


async def refunds(h, customer: int) -> list[tuple]:
    return await fetch(h, "SELECT reference, amount_cents FROM refunds WHERE customer_id = %s", (customer,))


async def test_an_edit_runs_exactly_the_edited_arguments_and_is_recorded_with_who_and_when(harness):
    graph, config, _, customer, shown = await waiting(harness, "edit-ok")
    (listed,) = shown["calls"]
    args = {**listed["args"], "amount_cents": 12000}

    state = await graph.ainvoke(resume_command({listed["tool_call_id"]: edit_call(listed, args)}, reviewer="alice"),
                                config)
    await harness.worker.drain()

    assert await refunds(harness, customer) == [("RMA-9", 12000)]
    assert await fetch(harness, "SELECT amount_cents FROM provider.payments") == [(12000,)]
    ((ledger_args,),) = await fetch(harness, "SELECT args FROM tool_executions")
    assert ledger_args == args
    ((status, words, details, by, when),) = await fetch(harness, DECIDED)
    assert (status, words, by, when) == ("decided", {listed["tool_call_id"]: "edit"}, "alice", True)
    recorded = details[listed["tool_call_id"]]
    assert recorded == {"decision": "edit", "args": args,
                        "args_sha256": args_hash({"name": "QueueRefund", "args": args})}
    assert args_hash({"name": "QueueRefund", "args": ledger_args}) == recorded["args_sha256"]  # what ran
    assert recorded["args_sha256"] != listed["args_sha256"]
    ai = next(m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert ai.tool_calls[0]["args"] == args and ai.tool_calls[0]["id"] == listed["tool_call_id"]  # same call, edited
    assert unanswered_tool_calls(state["messages"]) == []
    frame = await approval_decisions(harness.pool, "edit-ok")
    assert frame[["decision", "decided_by"]].values.tolist() == [["edit", "alice"]]


@pytest.mark.parametrize(("bad", "says"), [
    ({"amount_cents": "120.00"}, "amount_cents: Input should be a valid integer"),
    ({"amount_cents": 12000, "currency": "EUR"}, "currency: Extra inputs are not permitted"),
    ({"reference": "nul\x00byte"}, "reference: "),
])
async def test_an_edit_that_fails_validation_is_told_to_the_reviewer_and_changes_nothing(harness, bad, says):
    graph, config, _, customer, shown = await waiting(harness, "edit-bad")
    (listed,) = shown["calls"]
    call_id = listed["tool_call_id"]

    result = await graph.ainvoke(resume_command({call_id: edit_call(listed, {**listed["args"], **bad})}), config)

    (again,) = interrupts_of(result)  # the same request, with the reason for the reviewer
    assert again["request_key"] == shown["request_key"] and again["calls"] == shown["calls"]
    assert says in again["errors"][call_id]
    assert await fetch(harness, "SELECT status, decisions, decision_details, decided_by FROM approval_requests") == [
        ("pending", None, None, None)]
    assert await refunds(harness, customer) == []
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0

    await graph.ainvoke(resume_command({call_id: "approve"}), config)  # a second answer decides it
    assert await refunds(harness, customer) == [("RMA-9", 15000)]
    assert (await fetch(harness, "SELECT decisions FROM approval_requests")) == [({call_id: "approve"},)]


async def test_an_edit_bound_to_another_version_of_the_call_is_a_rejection(harness):
    graph, config, _, customer, shown = await waiting(harness, "edit-stale")
    (listed,) = shown["calls"]
    stale = {**edit_call(listed, {**listed["args"], "amount_cents": 100}), "args_sha256": "0" * 64}
    state = await graph.ainvoke(resume_command({listed["tool_call_id"]: stale}), config)
    assert await refunds(harness, customer) == []
    reply = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert reply.content == REJECTED_MESSAGE


async def test_a_rejection_gives_the_reviewers_reason_as_the_calls_answer(harness):
    graph, config, _, customer, shown = await waiting(harness, "reject-why")
    call_id = shown["calls"][0]["tool_call_id"]
    state = await graph.ainvoke(resume_command({call_id: reject_call("RMA-9 was refunded by cheque already")},
                                               reviewer="bob"), config)

    reply = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert reply.content == REJECTED_MESSAGE + " The reviewer said: RMA-9 was refunded by cheque already"
    assert classify(reply) == ("failed", "rejected")
    assert await refunds(harness, customer) == []
    ((status, words, details, by, when),) = await fetch(harness, DECIDED)
    assert (status, words, by, when) == ("decided", {call_id: "reject"}, "bob", True)
    assert details[call_id]["message"] == "RMA-9 was refunded by cheque already"


async def test_an_edit_days_later_through_a_crash_after_commit_refunds_the_edited_amount_once(harness):
    graph, config, node, customer, shown = await waiting(harness, "edit-late")
    (listed,) = shown["calls"]
    args = {**listed["args"], "amount_cents": 11000}

    def die_after_commit(calls):  # the process dies after the business commit, before the checkpoint
        node.hooks.after_commit.remove(die_after_commit)
        raise SimulatedCrash("process died after COMMIT")

    harness.provider.clock.advance(3 * DAY_S)  # the reviewer answers three days later
    node.hooks.after_commit.append(die_after_commit)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke(resume_command({listed["tool_call_id"]: edit_call(listed, args)}, reviewer="carol"),
                            config)
    assert await refunds(harness, customer) == [("RMA-9", 11000)]  # committed before the crash

    harness.provider.clock.advance(3 * DAY_S)  # the provider has forgotten every key it saw
    state = await graph.ainvoke(None, config)  # the thread resumes: the tools node runs the edited call again
    await harness.worker.drain()

    assert unanswered_tool_calls(state["messages"]) == []
    await harness.events.flush()
    assert await fetch(harness, "SELECT outcome FROM events WHERE kind = 'call' AND outcome = 'replayed'") == [
        ("replayed",)]
    assert await refunds(harness, customer) == [("RMA-9", 11000)]
    assert await fetch(harness, "SELECT amount_cents FROM provider.payments") == [(11000,)]
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 1
    assert await fetch(harness, "SELECT decided_by, decisions FROM approval_requests") == [
        ("carol", {listed["tool_call_id"]: "edit"})]


async def test_a_call_changed_after_its_edit_was_decided_is_not_run(harness):
    graph, config, node, customer, shown = await waiting(harness, "edit-then-changed")
    (listed,) = shown["calls"]
    args = {**listed["args"], "amount_cents": 12000}

    def die_before_the_call(call, index):  # the process dies after the decision, before the tools ran
        node.hooks.before_call.remove(die_before_the_call)
        raise SimulatedCrash("process died before the tools node")

    node.hooks.before_call.append(die_before_the_call)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke(resume_command({listed["tool_call_id"]: edit_call(listed, args)}), config)
    state = await graph.aget_state(config)
    assert state.values["approved"]["calls"] == {listed["tool_call_id"]: args_hash({"name": "QueueRefund",
                                                                                   "args": args})}
    ai = next(m for m in reversed(state.values["messages"]) if isinstance(m, AIMessage))
    changed = ai.model_copy(update={"tool_calls": [{**ai.tool_calls[0], "args": {**args, "amount_cents": 900_000}}]})
    await graph.aupdate_state(config, {"messages": [changed]}, as_node="approve")  # skips the approval

    final = await graph.ainvoke(None, config)

    reply = next(m for m in final["messages"] if isinstance(m, ToolMessage))
    assert reply.content.startswith("FAILED [rejected]: this call was changed after a reviewer decided it")
    assert await refunds(harness, customer) == []
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_an_edit_decided_before_a_crash_runs_as_edited_when_the_thread_resumes_days_later(harness):
    graph, config, node, customer, shown = await waiting(harness, "edit-crash-before-tools")
    (listed,) = shown["calls"]
    args = {**listed["args"], "amount_cents": 13000}

    def die_before_the_call(call, index):
        node.hooks.before_call.remove(die_before_the_call)
        raise SimulatedCrash("process died before the tools node")

    node.hooks.before_call.append(die_before_the_call)
    with pytest.raises(SimulatedCrash):
        await graph.ainvoke(resume_command({listed["tool_call_id"]: edit_call(listed, args)}), config)
    assert await refunds(harness, customer) == []

    harness.provider.clock.advance(5 * DAY_S)
    state = await graph.ainvoke(None, config)
    await harness.worker.drain()

    assert unanswered_tool_calls(state["messages"]) == []
    assert await refunds(harness, customer) == [("RMA-9", 13000)]
    assert await fetch(harness, "SELECT amount_cents FROM provider.payments") == [(13000,)]
    assert await scalar(harness, "SELECT count(*) FROM approval_requests") == 1  # not asked again
