"""C21: a NUL byte in a call that needs approval is refused before any request is built; no crash."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.core.storable import storable_text, unstorable_path
from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
from agentlab.durable.approval import ApprovalPolicy, interrupts_of, resume_command
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar


def nul_refund(reference: str = "RMA\x00-1", **extra) -> Scenario:
    return Scenario(
        name="nul-refund", title="a refund whose reference holds a NUL byte",
        prompt="Refund RMA-1, 300.00, to the card.",
        customers=(CustomerSpec("acme", "Acme Outfitters", 0),),
        steps=((PlannedCall("QueueRefund", {"customer_id": C(0), "reference": reference, "amount_cents": 30000,
                                            **extra}),),),
        intended=Intended(final_credit_cents=(0,), refunds=(0,), provider_refunds=(0,), invoices=(0,),
                          credit_memos=(0,), provider_charges=(0,)),
    )


async def play(h, scenario: Scenario, sg_name: str, thread: str):
    sg = preset(sg_name)
    ids = await h.create_customers(scenario, sg)
    model = ScriptedChatModel(script=scenario.script(ids), seed=0)
    graph = build_graph(model, h.node(sg), checkpointer=h.saver, approval=ApprovalPolicy())
    config = run_config(thread, tenant_id=scenario.tenant_id)
    result = await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]}, config)
    return graph, config, ids, result


def replies_to_first_batch(messages) -> list[ToolMessage]:
    first = next(m for m in messages if getattr(m, "tool_calls", None))
    ids = {tc["id"] for tc in first.tool_calls}
    return [m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id in ids]


@pytest.mark.parametrize("sg_name", ["full", "naive"])
async def test_c21_a_nul_byte_in_a_refund_that_needs_approval_gets_one_failed_and_no_request(harness, sg_name):
    graph, config, ids, result = await play(harness, nul_refund(), sg_name, f"c21-{sg_name}")
    assert interrupts_of(result) == []  # nobody is asked to approve a call that cannot be stored
    (reply,) = replies_to_first_batch(result["messages"])
    assert reply.content.startswith("FAILED [invalid_arguments]: argument 'reference'")
    assert "cannot be stored" in reply.content and "\x00" not in reply.content
    assert await scalar(harness, "SELECT count(*) FROM approval_requests") == 0
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == 0
    assert await scalar(harness, "SELECT count(*) FROM lax.refunds WHERE customer_id = %s", (ids[0],)) == 0
    assert await scalar(harness, "SELECT count(*) FROM outbox") == 0
    again = await graph.ainvoke(resume_command("approve"), config)  # a resume does not crash either
    assert "\x00" not in str([m.content for m in again["messages"]])


async def test_c21_a_nul_byte_in_an_argument_the_tool_ignores_does_not_bypass_approval(harness):
    # without validation an unknown argument passes to the handler, which ignores it: the approval node
    # must still refuse the call rather than let it run unapproved
    graph, config, ids, result = await play(harness, nul_refund("RMA-1", note="a\x00b"), "naive", "c21-extra")
    assert interrupts_of(result) == []
    (reply,) = replies_to_first_batch(result["messages"])
    assert reply.content.startswith("FAILED [invalid_arguments]: argument 'note'")
    assert await scalar(harness, "SELECT count(*) FROM lax.refunds WHERE customer_id = %s", (ids[0],)) == 0
    assert await scalar(harness, "SELECT count(*) FROM approval_requests") == 0


async def test_c21_free_text_fields_refuse_a_nul_byte_before_any_sql(harness):
    from agentlab.core.tools_node import TransactionalToolsNode  # noqa: F401  (the node under test, via the harness)

    ids = await harness.create_customers(nul_refund(), preset("full"))
    batch = await harness.node(preset("full")).run_batch(
        [{"id": "m1", "name": "CreateCreditMemo",
          "args": {"customer_id": ids[0], "amount_cents": 500, "reference": "CM-1", "reason": "late\x00 delivery"}}],
        thread_id="c21-memo", tenant_id="acme")
    (msg,) = batch.messages
    assert msg.content.startswith("FAILED [invalid_arguments]: argument 'reason'")
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (ids[0],)) == 0


def test_c21_the_one_check_finds_the_value_at_any_depth_and_escapes_kit_texts():
    assert unstorable_path({"a": [1, {"b": "x\x00"}]}) == "a[1].b"
    assert unstorable_path({"ok": "caf\u00e9", "n": 3}) is None
    assert unstorable_path(["\ud800"]) == "[0]"
    assert storable_text("a\x00b\ud800") == "a\\x00b?"
    assert storable_text("plain") == "plain"


async def test_c21_an_outbox_error_text_with_a_nul_byte_is_stored_escaped(harness):
    import json

    from agentlab.core.errors import ProviderError

    async with harness.pool.connection() as conn:
        await conn.execute("INSERT INTO outbox (topic, payload, dedupe_key) VALUES ('payment.refund', %s, 'k')",
                           (json.dumps({"customer_id": 3, "amount_cents": 100}),))
    real, failed = harness.provider.create_refund, []

    async def once_bad(*args, **kw):
        if not failed:
            failed.append(1)
            raise ProviderError("upstream said: bad\x00thing")
        return await real(*args, **kw)

    harness.provider.create_refund = once_bad
    stats = await harness.worker.drain()
    assert (stats.retried, stats.dispatched) == (1, 1)
    assert await fetch(harness, "SELECT status, attempts FROM outbox") == [("dispatched", 2)]
