"""C22: an approval answers exactly the call the reviewer saw; a call edited while it waits needs a new answer."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
from agentlab.durable.approval import ApprovalPolicy, args_hash, interrupts_of, pending_requests, resume_command
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

REFUND = Scenario(
    name="one-refund", title="one refund above the threshold",
    prompt="Refund RMA-9, 150.00, to the card.",
    customers=(CustomerSpec("acme", "Acme Outfitters", 0),),
    steps=((PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-9", "amount_cents": 15000}),),),
    intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), invoices=(0,),
                      credit_memos=(0,), provider_charges=(0,)),
)


async def waiting(h, thread: str):
    sg = preset("full")
    ids = await h.create_customers(REFUND, sg)
    graph = build_graph(ScriptedChatModel(script=REFUND.script(ids), seed=0), h.node(sg), checkpointer=h.saver,
                        approval=ApprovalPolicy())
    config = run_config(thread, tenant_id=REFUND.tenant_id)
    (request,) = interrupts_of(await graph.ainvoke({"messages": [HumanMessage(REFUND.prompt)]}, config))
    return graph, config, ids[0], request


async def edit_amount(graph, config, amount_cents: int) -> str:
    """Edit the waiting AIMessage in place (same message id, same tool call id), as LangGraph allows."""
    state = await graph.aget_state(config)
    ai = next(m for m in reversed(state.values["messages"]) if isinstance(m, AIMessage))
    (call,) = ai.tool_calls
    edited = AIMessage(content=ai.content, id=ai.id,
                       tool_calls=[{**call, "args": {**call["args"], "amount_cents": amount_cents}}])
    await graph.aupdate_state(config, {"messages": [edited]}, as_node="agent")
    return call["id"]


async def refunds(h, customer: int) -> list[tuple]:
    return await fetch(h, "SELECT reference, amount_cents FROM refunds WHERE customer_id = %s", (customer,))


async def test_c22_an_old_approve_does_not_apply_an_edited_call(harness):
    graph, config, customer, shown = await waiting(harness, "c22-edit")
    assert shown["calls"][0]["amount_cents"] == 15000
    call_id = await edit_amount(graph, config, 900_000)

    result = await graph.ainvoke(resume_command({call_id: "approve"}), config)  # the answer to 150.00

    (again,) = interrupts_of(result)  # the thread stops on a new request, showing what would now be paid
    assert again["request_key"] != shown["request_key"]
    assert again["calls"][0]["amount_cents"] == 900_000
    assert again["calls"][0]["args_sha256"] != shown["calls"][0]["args_sha256"]
    assert [r["request_key"] for r in await pending_requests(graph, config)] == [again["request_key"]]
    assert await refunds(harness, customer) == []
    assert await scalar(harness, "SELECT count(*) FROM outbox") == 0
    rows = await fetch(harness, "SELECT request_key, status, calls->0->>'amount_cents' FROM approval_requests "
                                "ORDER BY requested_at")
    assert [(s, a) for _, s, a in rows] == [("pending", "15000"), ("pending", "900000")]

    await graph.ainvoke(resume_command({call_id: "reject"}), config)  # the reviewer sees 900,000: no
    await harness.worker.drain()
    assert await refunds(harness, customer) == []
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 0
    decided = await fetch(harness, "SELECT decisions FROM approval_requests WHERE request_key = %s",
                          (again["request_key"],))
    assert decided == [({call_id: "reject"},)]


async def test_c22_the_new_request_approved_pays_what_the_reviewer_saw_once(harness):
    graph, config, customer, shown = await waiting(harness, "c22-edit-approved")
    call_id = await edit_amount(graph, config, 20_000)
    (again,) = interrupts_of(await graph.ainvoke(resume_command({call_id: "approve"}), config))
    await graph.ainvoke(resume_command({call_id: "approve"}), config)
    await harness.worker.drain()
    assert await refunds(harness, customer) == [("RMA-9", 20_000)]
    assert await fetch(harness, "SELECT amount_cents FROM provider.payments") == [(20_000,)]


async def test_c22_an_unedited_call_is_decided_by_the_first_answer(harness):
    graph, config, customer, shown = await waiting(harness, "c22-plain")
    result = await graph.ainvoke(resume_command({shown["calls"][0]["tool_call_id"]: "approve"}), config)
    assert interrupts_of(result) == []
    await harness.worker.drain()
    assert await refunds(harness, customer) == [("RMA-9", 15_000)]
    assert await scalar(harness, "SELECT count(*) FROM approval_requests") == 1


async def test_c22_an_answer_naming_another_request_key_or_hash_approves_nothing(harness):
    graph, config, customer, shown = await waiting(harness, "c22-bound")
    call = shown["calls"][0]
    stale = {"request_key": shown["request_key"] + "-old", "decisions": {call["tool_call_id"]: "approve"}}
    (again,) = interrupts_of(await graph.ainvoke(resume_command(stale), config))
    assert again["request_key"] == shown["request_key"]  # still waiting on the one request shown
    wrong_hash = {call["tool_call_id"]: {"decision": "approve", "args_sha256": "0" * 64}}
    await graph.ainvoke(resume_command({"request_key": shown["request_key"], "decisions": wrong_hash}), config)
    assert await refunds(harness, customer) == []
    assert await scalar(harness, "SELECT status FROM approval_requests") == "decided"


def test_c22_the_hash_covers_tool_and_arguments_not_their_order():
    a = {"name": "QueueRefund", "args": {"amount_cents": 1, "reference": "R"}}
    assert args_hash(a) == args_hash({"name": "QueueRefund", "args": {"reference": "R", "amount_cents": 1}})
    assert args_hash(a) != args_hash({"name": "QueueRefund", "args": {"amount_cents": 2, "reference": "R"}})
    assert args_hash(a) != args_hash({"name": "QueueCharge", "args": a["args"]})
