"""The concurrency family against the documented baselines: the agent's own graph run twice at once on one
customer, the interleaving forced on the connections of the pool the lab hands it; every figure is read
back from the database, the provider's payments and the checkpoints."""

from __future__ import annotations

import pytest
from langgraph.prebuilt import ToolNode

from agentlab.lab.agents import AgentContext, AgentSpec, baseline
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES, billing_tools
from agentlab.lab.agents.toolnode import build_toolnode_agent
from agentlab.lab.faults import CONCURRENCY_FAMILY
from agentlab.lab.yardstick import Yardstick
from agentlab.lab.yardstick_faults import YARDSTICK_FAULTS
from agentlab.lab.yardstick_table import run_yardstick
from conftest import fetch, scalar

# fault -> the kind each baseline must show
SHOWS = {
    "same_thread_runs": "forked_thread",
    "double_submit": "unanswered_call",  # the natural key holds; the twin's run raises with its call unanswered
    "lost_update": "lost_update",
    "check_then_act": "cap_exceeded",
    "write_skew": "cap_exceeded",
}


async def credit_and_redemptions(h, cid: int) -> tuple[int, list[int]]:
    credit = await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (cid,))
    rows = await fetch(h, "SELECT amount_cents FROM limits.credit_redemptions WHERE customer_id = %s "
                          "ORDER BY id", (cid,))
    return credit, [a for a, in rows]


def test_the_family_is_in_the_yardstick_and_the_baselines_have_its_tools_as_first_drafts():
    assert tuple(f for f in YARDSTICK_FAULTS if f in CONCURRENCY_FAMILY) == CONCURRENCY_FAMILY == tuple(SHOWS)
    tools = {t.name: t for t in billing_tools(pool=None, provider=None)}
    assert BASELINE_TOOL_NAMES["RedeemCredit"] == "redeem_credit" and "refund_within_cap" in tools
    schema = tools["redeem_credit"].tool_call_schema.model_json_schema()  # the signature is the schema
    assert schema["properties"]["amount_cents"]["type"] == "integer" and schema["required"] == ["customer_id",
                                                                                                 "amount_cents"]

    class Model:
        def bind_tools(self, tools):
            return self

    graph = baseline("toolnode").build(AgentContext(Model(), None, None, None, None))
    node = graph.nodes["tools"].bound
    assert isinstance(node, ToolNode) and {"redeem_credit", "refund_within_cap"} <= set(node.tools_by_name)


@pytest.mark.parametrize("agent", ["toolnode", "create_agent"])
async def test_two_redemptions_at_once_lose_one_deduction_in_the_baselines_not_in_the_kit(harness, agent):
    ys = Yardstick(harness)
    run = await ys.run(agent, "lost_update", seed=0)
    assert run.status == "ran" and run.raised is None  # nothing raised: the loss is silent
    credit, redeemed = await credit_and_redemptions(harness, run.customer_ids[0])
    assert redeemed == [2000, 1500]  # both applied, A first (the barrier's order)
    assert credit == 3500  # B wrote 5000 - 1500 over A's 3000: A's deduction is lost
    assert run.counts()["lost_update"] == 1 and run.counts()["balance_mismatch"] == 1
    assert run.notes["rendezvous"][-1] == "B goes on (the other's act committed first)"
    kit = await ys.run("kit", "lost_update", seed=0)
    assert kit.violations == [] and (await credit_and_redemptions(harness, kit.customer_ids[0]))[0] == 1500


async def test_check_then_act_redeems_more_than_the_credit_and_write_skew_refunds_past_the_cap(harness):
    ys = Yardstick(harness)
    cta = await ys.run("toolnode", "check_then_act", seed=0)
    credit, redeemed = await credit_and_redemptions(harness, cta.customer_ids[0])
    assert redeemed == [3000, 3000] and credit == 2000  # 6000 redeemed of 5000
    assert cta.counts()["cap_exceeded"] == 1
    skew = await ys.run("create_agent", "write_skew", seed=0)
    cid = skew.customer_ids[0]
    assert await scalar(harness, "SELECT sum(amount_cents) FROM refunds WHERE customer_id = %s", (cid,)) == 6000
    paid = await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'refund'",
                        (f"cus_{cid}",))
    assert paid == 2 and skew.counts()["cap_exceeded"] == 1  # cap 5000 a day
    kit = await ys.run("kit", "write_skew", seed=0)
    assert kit.violations == []
    assert await scalar(harness, "SELECT sum(amount_cents) FROM refunds WHERE customer_id = %s",
                        (kit.customer_ids[0],)) == 3000


async def test_one_request_twice_on_one_thread_forks_the_baselines_checkpoints_and_the_kits_lease_refuses_one(harness):
    ys = Yardstick(harness)
    run = await ys.run("toolnode", "same_thread_runs", seed=0)
    assert run.notes["threads"] == [run.thread_id]
    roots = await scalar(harness, "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                                  "AND parent_checkpoint_id IS NULL", (run.thread_id,))
    assert roots == 2  # two chains on one thread
    credit, redeemed = await credit_and_redemptions(harness, run.customer_ids[0])
    assert redeemed == [2000, 2000] and credit == 3000  # applied twice, and the second wrote over the first
    assert {"forked_thread", "lost_update"} <= {v.kind for v in run.violations}
    kit = await ys.run("kit", "same_thread_runs", seed=0)
    assert kit.violations == [] and kit.raised == "1 of 2 runs: ThreadBusy (refused)"
    assert await credit_and_redemptions(harness, kit.customer_ids[0]) == (3000, [2000])


async def test_a_double_submitted_refund_meets_the_natural_key_and_the_twins_run_raises(harness):
    run = await Yardstick(harness).run("toolnode", "double_submit", seed=0)
    cid = run.customer_ids[0]
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1
    assert run.raised == "1 of 2 runs: UniqueViolation (23505)"
    assert run.notes["raised_by"] == {"B": "UniqueViolation (23505)"}  # the barrier lets A's INSERT go first
    assert [v.kind for v in run.violations] == ["unanswered_call"]


async def test_an_agent_whose_tools_never_send_the_barriers_statement_is_na_not_a_pass(harness):
    from langchain_core.tools import tool

    def atomic(ctx):
        @tool
        async def redeem_credit(customer_id: int, amount_cents: int) -> dict:
            """Redeem amount_cents of the customer's store credit."""
            async with ctx.pool.connection() as conn:
                await conn.execute("UPDATE customers SET credit_cents = credit_cents - %s WHERE id = %s",
                                   (amount_cents, customer_id))
            return {"redeemed_cents": amount_cents}

        return build_toolnode_agent(ctx.model, [redeem_credit], checkpointer=ctx.checkpointer)

    run = await Yardstick(harness).run(AgentSpec("atomic", atomic, BASELINE_TOOL_NAMES), "lost_update", seed=0)
    assert run.status == "n/a" and "barrier" in run.reason and "atomic" in run.reason
    assert run.notes["rendezvous"] == []
    real = await Yardstick(harness, model=lambda script, seed: None).run("toolnode", "write_skew")
    assert real.status == "n/a" and "two runs' calls are scripted" in real.reason


@pytest.mark.slow
async def test_same_seed_same_table_violations_by_kind_and_the_kit_at_zero():
    agents = ["toolnode", "create_agent", "kit"]
    one = await run_yardstick(agents, CONCURRENCY_FAMILY, seed=5)
    two = await run_yardstick(agents, CONCURRENCY_FAMILY, seed=5)
    assert one.rows.equals(two.rows)
    assert (one.summary["kit:full"] == 0).all() and (one.rows["status"] == "ran").all()
    kinds = one.by_kind()
    for agent in ("toolnode", "create_agent"):
        for fault, kind in SHOWS.items():
            assert one.rows.set_index(["agent", "fault"]).loc[(agent, fault), kind] >= 1, (agent, fault, kind)
        assert kinds.loc[agent, "lost_update"] >= 3 and kinds.loc[agent, "forked_thread"] == 1
    raised = one.raised()
    assert raised.loc["double_submit", "toolnode"] == "1 of 2 runs: UniqueViolation (23505)"
    assert raised.loc["same_thread_runs", "kit:full"] == "1 of 2 runs: ThreadBusy (refused)"
    assert raised.loc["lost_update", "create_agent"] == "-"
