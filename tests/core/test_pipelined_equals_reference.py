"""The pipelined strategy is an optimisation of the reference path, never a different behaviour.

The suite's hostile batches (``tests/hostile.py``: clean batches that reach the database's own refusals,
hostile ones with odd ids, unknown tools and wrong arguments) run through the reference
(:class:`SavepointStrategy`, psycopg's nested transactions) on one database and through the
:class:`PipelinedStrategy` on a twin made from the same template. Each batch runs twice on the same thread
(the second run is a node retry: the ledger answers). After every run both give the same answers (outcome,
content, category, stored result, rolled back) and both databases hold the same rows, under the atomic and
the partial policy.

With tool-call budgets (:mod:`agentlab.core.batch.budgets`), small enough that the hostile batches go over
them, both give the same answers and hold the same counters (``runs.call_budgets``) too.

``AGENTLAB_DIFFERENTIAL_EXAMPLES`` sets the number of batches per policy (default 120; a quarter of that
with budgets).
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest
from hostile import batches, quiet_events  # noqa: F401  (an autouse fixture)
from hypothesis import HealthCheck, given, settings

from agentlab.core.batch import CallBudgets, PipelinedStrategy, SavepointStrategy, TransactionalToolsNode
from agentlab.core.safeguards import Policy, preset
from agentlab.runtime import db
from agentlab.runtime.harness import Harness

EXAMPLES = int(os.environ.get("AGENTLAB_DIFFERENTIAL_EXAMPLES", "120"))
TABLES = {"customers": "id", "invoices": "id", "credit_memos": "id", "refunds": "id", "outbox": "id",
          "tool_executions": "idempotency_key", "runs.call_budgets": "scope, scope_id, tool"}
BUDGETS = CallBudgets(per_thread=3, per_run=2, per_thread_by_tool={"ApplyCredit": 1, "QueueRefund": 2},
                      per_run_by_tool={"CreateInvoice": 1})
ROWS = "SELECT coalesce(jsonb_agg(to_jsonb(t) - 'created_at' - 'available_at' ORDER BY {key}), '[]') FROM {table} t"
SEED_CUSTOMERS = ("INSERT INTO customers (tenant_id, name, credit_cents) "
                  "SELECT 'acme', 'Twin ' || g, 100000 FROM generate_series(1, 3) g RETURNING id")


async def rows(h: Harness) -> dict:
    async with h.pool.connection() as conn:
        return {table: (await (await conn.execute(ROWS.format(table=table, key=key))).fetchone())[0]
                for table, key in TABLES.items()}


def answers(batch) -> list[tuple]:
    return [(r.index, r.call_id, r.tool, r.outcome, r.content, r.category, r.result) for r in batch.results] + [
        batch.rolled_back]


@pytest.mark.parametrize("policy", [Policy.ATOMIC, Policy.PARTIAL])
def test_the_pipelined_strategy_answers_and_stores_what_the_reference_does(policy):
    differential(policy, None, EXAMPLES)


@pytest.mark.parametrize("policy", [Policy.ATOMIC, Policy.PARTIAL])
def test_the_pipelined_strategy_spends_and_refuses_call_budgets_as_the_reference_does(policy):
    differential(policy, BUDGETS, max(1, EXAMPLES // 4))


def differential(policy: Policy, budgets: CallBudgets | None, examples_wanted: int) -> None:
    sg = preset("full").replace(policy=policy)
    urls = [db.create_database("twin-ref"), db.create_database("twin-pipe")]
    try:
        with asyncio.Runner() as runner:
            reference, pipelined = [runner.run(Harness.open(url)) for url in urls]
            try:
                ids = [runner.run(_seed(h)) for h in (reference, pipelined)]
                assert ids[0] == ids[1]
                nodes = [TransactionalToolsNode(h.pool, sg, toolset=h.toolset, provider=h.provider, events=h.events,
                                                error_hints=h.domain.error_hints, strategy=strategy,
                                                call_budgets=budgets)
                         for h, strategy in ((reference, SavepointStrategy()), (pipelined, PipelinedStrategy()))]
                threads, examples = itertools.count(), itertools.count()
                over_budget: list[tuple] = []  # calls both answered FAILED [budget]

                @settings(max_examples=examples_wanted, deadline=None, database=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
                @given(calls=batches(ids[0]))
                def check(calls):
                    next(examples)
                    n = next(threads)
                    # with budgets, three batches per thread spend its counters and two per run
                    thread = f"t-twin-{n if budgets is None else n // 3}"
                    for attempt in (1, 2):  # the second run is a node retry: the ledger answers
                        got = [answers(runner.run(node.run_batch(calls, thread_id=thread, tenant_id="acme",
                                                                 attempt=attempt, final_attempt=True,
                                                                 run_id=f"run-{n // 2}")))
                               for node in nodes]
                        assert got[0] == got[1], calls
                        over_budget.extend(a for a in got[0][:-1] if a[5] == "budget")
                        assert runner.run(rows(reference)) == runner.run(rows(pipelined)), calls

                check()
                assert next(examples) >= examples_wanted
                assert bool(over_budget) == (budgets is not None)  # with budgets, some calls went over them
            finally:
                for h in (reference, pipelined):
                    runner.run(h.close())
    finally:
        for url in urls:
            db.drop_database(url)


async def _seed(h: Harness) -> list[int]:
    async with h.pool.connection() as conn:
        return [r[0] for r in await (await conn.execute(SEED_CUSTOMERS)).fetchall()]
