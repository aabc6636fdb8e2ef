"""Tool-call budgets are rows spent inside the batch's transaction: they hold across crashes, resumes and two
runs at once, on a real PostgreSQL (:mod:`agentlab.core.batch.budgets`)."""

from __future__ import annotations

import asyncio

import pytest

from agentlab.bench.batch import traced_statements
from agentlab.core.batch import (
    BudgetSpent,
    CallBudgets,
    Outcome,
    PipelinedStrategy,
    SavepointStrategy,
    TransactionalToolsNode,
)
from agentlab.core.errors import DomainError, SimulatedCrash
from agentlab.core.safeguards import Policy, preset
from conftest import fetch, scalar

SEED = "INSERT INTO customers (tenant_id, name, credit_cents) VALUES ('acme', 'Budget Co', 10000) RETURNING id"
COUNTERS = "SELECT scope, scope_id, tool, used, limit_calls FROM runs.call_budgets ORDER BY 1, 2, 3"


def credits(customer: int, ids, amount: int = 100) -> list[dict]:
    return [{"name": "ApplyCredit", "args": {"customer_id": customer, "amount_cents": amount}, "id": i} for i in ids]


def node_for(h, budgets: CallBudgets, policy: Policy = Policy.PARTIAL, **changes) -> TransactionalToolsNode:
    return TransactionalToolsNode(h.pool, preset("full").replace(policy=policy, **changes), toolset=h.toolset,
                                  provider=h.provider, events=h.events, error_hints=h.domain.error_hints,
                                  call_budgets=budgets)


async def customer(h) -> int:
    async with h.pool.connection() as conn:
        return (await (await conn.execute(SEED)).fetchone())[0]


@pytest.mark.parametrize("budgets", [
    {"per_thread": 0}, {"per_run": -1}, {"per_thread": True}, {"per_run": 2.5},
    {"per_thread_by_tool": {"ApplyCredit": 0}}, {"per_run_by_tool": {"ApplyCredit": None}},
    {"per_run_by_tool": {"*": 3}},
])
def test_a_budget_of_zero_or_less_or_not_a_whole_number_is_refused_when_declared(budgets):
    with pytest.raises(DomainError, match="above zero|not a tool name"):
        CallBudgets(**budgets)


async def test_a_budget_naming_a_tool_the_toolset_lacks_is_refused(harness):
    with pytest.raises(DomainError, match="'ApplyCredits', which is not a tool"):
        node_for(harness, CallBudgets(per_thread_by_tool={"ApplyCredits": 1}))


async def test_a_call_over_the_thread_budget_is_failed_naming_the_limit_and_its_siblings_go_on(harness):
    c = await customer(harness)
    node = node_for(harness, CallBudgets(per_thread_by_tool={"ApplyCredit": 2}))
    batch = await node.run_batch(credits(c, ["a", "b", "c"]), thread_id="t-budget", tenant_id="acme")

    assert [r.outcome for r in batch.results] == [Outcome.APPLIED, Outcome.APPLIED, Outcome.FAILED]
    assert batch.results[2].category == "budget"
    assert batch.results[2].content == (
        "FAILED [budget]: this thread's limit of 2 tool calls of ApplyCredit is reached; this call was not "
        "applied. Do not send ApplyCredit calls again in this thread.")
    assert await fetch(harness, COUNTERS) == [("thread", "t-budget", "ApplyCredit", 2, 2)]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (c,)) == 10000 - 200
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 2


async def test_under_the_atomic_policy_a_call_over_budget_rolls_the_batch_and_its_spending_back(harness):
    c = await customer(harness)
    node = node_for(harness, CallBudgets(per_thread=2), Policy.ATOMIC)
    batch = await node.run_batch(credits(c, ["a", "b", "c"]), thread_id="t-atomic", tenant_id="acme")

    assert batch.rolled_back
    assert [(r.outcome, r.category) for r in batch.results] == [
        (Outcome.NOT_APPLIED, "not_applied"), (Outcome.NOT_APPLIED, "not_applied"), (Outcome.FAILED, "budget")]
    assert await fetch(harness, COUNTERS) == []  # nothing applied, nothing spent
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (c,)) == 10000


async def test_a_run_budget_counts_per_run_id_and_the_thread_budget_over_all_runs(harness):
    c = await customer(harness)
    node = node_for(harness, CallBudgets(per_thread=3, per_run=2))
    first = await node.run_batch(credits(c, ["a", "b", "c"]), thread_id="t-runs", tenant_id="acme", run_id="r1")
    second = await node.run_batch(credits(c, ["d", "e"]), thread_id="t-runs", tenant_id="acme", run_id="r2")

    assert [r.outcome for r in first.results] == [Outcome.APPLIED, Outcome.APPLIED, Outcome.FAILED]
    assert "this run's limit of 2 tool calls is reached" in first.results[2].content
    assert [r.outcome for r in second.results] == [Outcome.APPLIED, Outcome.FAILED]
    assert "this thread's limit of 3 tool calls is reached" in second.results[1].content
    assert await fetch(harness, COUNTERS) == [("run", "r1", "*", 2, 2), ("run", "r2", "*", 1, 2),
                                              ("thread", "t-runs", "*", 3, 3)]


@pytest.mark.parametrize("thread_lock", [True, False], ids=["advisory-lock", "row-lock-only"])
async def test_two_concurrent_runs_on_one_thread_cannot_together_exceed_its_budget(harness, thread_lock):
    c = await customer(harness)
    budgets = CallBudgets(per_thread=3)
    nodes = [node_for(harness, budgets, lock=thread_lock) for _ in range(2)]  # two processes, one database
    both = await asyncio.gather(*(
        node.run_batch(credits(c, [f"{run}-{i}" for i in range(3)]), thread_id="t-twice", tenant_id="acme",
                       run_id=run) for node, run in zip(nodes, ("r1", "r2"), strict=True)))

    outcomes = [r.outcome for batch in both for r in batch.results]
    assert outcomes.count(Outcome.APPLIED) == 3 and outcomes.count(Outcome.FAILED) == 3
    assert {r.category for batch in both for r in batch.results if r.outcome is Outcome.FAILED} == {"budget"}
    assert await fetch(harness, COUNTERS) == [("thread", "t-twice", "*", 3, 3)]
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = 't-twice'") == 3
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (c,)) == 10000 - 300


async def test_a_crash_after_commit_and_a_resume_do_not_reset_the_budget(harness):
    c = await customer(harness)
    budgets = CallBudgets(per_thread=2)
    crashed = node_for(harness, budgets)

    def die(calls):
        raise SimulatedCrash("the process died after COMMIT, before the checkpoint")

    crashed.hooks.after_commit.append(die)
    with pytest.raises(SimulatedCrash):
        await crashed.run_batch(credits(c, ["a", "b"]), thread_id="t-crash", tenant_id="acme")
    assert await fetch(harness, COUNTERS) == [("thread", "t-crash", "*", 2, 2)]  # committed with the calls

    restarted = node_for(harness, budgets)  # a new process: nothing in memory
    replay = await restarted.run_batch(credits(c, ["a", "b"]), thread_id="t-crash", tenant_id="acme", attempt=2)
    later = await restarted.run_batch(credits(c, ["c"]), thread_id="t-crash", tenant_id="acme")

    assert [r.outcome for r in replay.results] == [Outcome.REPLAYED, Outcome.REPLAYED]  # not spent again
    assert [(r.outcome, r.category) for r in later.results] == [(Outcome.FAILED, "budget")]
    assert await fetch(harness, COUNTERS) == [("thread", "t-crash", "*", 2, 2)]
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (c,)) == 10000 - 200


def test_budget_spent_is_a_tool_error_of_its_own_category():
    (limit,) = CallBudgets(per_run_by_tool={"QueueRefund": 1}).limits("QueueRefund")
    err = BudgetSpent(limit)
    assert err.category.value == "budget"
    assert err.hint == ("this run's limit of 1 tool call of QueueRefund is reached; this call was not applied. "
                        "Do not send QueueRefund calls again in this run.")


@pytest.mark.parametrize(("strategy", "without", "with_budgets"), [
    (SavepointStrategy(), 14, 17), (PipelinedStrategy(), 5, 8)], ids=["reference", "pipelined"])
async def test_a_budget_costs_one_statement_and_one_round_trip_per_call_and_nothing_without(
        harness, strategy, without, with_budgets):
    c = await customer(harness)
    trips = {}
    for budgets in (None, CallBudgets(per_thread=10, per_run_by_tool={"ApplyCredit": 5})):
        async def batch(pool, budgets=budgets):
            node = TransactionalToolsNode(pool, preset("full").replace(isolation=False), toolset=harness.toolset,
                                          events=harness.events, strategy=strategy, call_budgets=budgets)
            result = await node.run_batch(credits(c, ["a", "b", "c"], amount=1), thread_id=f"t-trips-{budgets is None}")
            assert [r.outcome for r in result.results] == [Outcome.APPLIED] * 3

        sent = await traced_statements(harness.url, batch)
        trips[budgets is not None] = sent.round_trips
        spent = [s for s in sent.statements if "spend_calls" in s]
        assert len(spent) == (3 if budgets is not None else 0)
    assert trips == {False: without, True: with_budgets}  # the pipelined path reads each answer before the tool


async def test_a_graph_run_counts_its_calls_under_the_run_id_of_its_config(harness):
    from langchain_core.messages import HumanMessage

    from agentlab.core.graph import build_graph, run_config
    from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
    from agentlab.sim.model import ScriptedChatModel

    refund = Scenario(
        name="one-small-refund", title="one refund", prompt="Refund RMA-5, 50.00, to the card.",
        customers=(CustomerSpec("acme", "Acme Outfitters", 0),),
        steps=((PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-5", "amount_cents": 5000}),),),
        intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), invoices=(0,),
                          credit_memos=(0,), provider_charges=(0,)))
    sg = preset("full")
    ids = await harness.create_customers(refund, sg)
    node = harness.node(sg)
    node.call_budgets = CallBudgets(per_thread=5, per_run_by_tool={"QueueRefund": 1})
    graph = build_graph(ScriptedChatModel(script=refund.script(ids), seed=0), node, checkpointer=harness.saver)

    await graph.ainvoke({"messages": [HumanMessage(refund.prompt)]},
                        run_config("t-graph-budget", tenant_id="acme", run_id="run-7"))

    assert await fetch(harness, COUNTERS) == [("run", "run-7", "QueueRefund", 1, 1),
                                              ("thread", "t-graph-budget", "*", 1, 5)]
