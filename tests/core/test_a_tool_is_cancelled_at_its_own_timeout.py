"""Per-tool timeouts: a tool's statements are cancelled at its own budget, inside its call's savepoint.

A tool declares ``timeout_ms`` on its spec. Its call runs under that ``statement_timeout`` (``SET LOCAL`` in
the call's savepoint), the batch's is restored before the call's ledger row, and a call cancelled at its
budget is answered ``FAILED [timeout]``, its siblings per the policy. Checked on both strategies and read back
from the database: what ROLLBACK TO undoes (the cancelled call's writes and its budget), what RELEASE would
keep (a budget, were it not restored) and that a call whose COMMIT is slow is still reported as stored.
"""

from __future__ import annotations

import time

import pytest

from agentlab.bench.batch import traced_statements
from agentlab.core.batch import Outcome, PipelinedStrategy, SavepointStrategy, TransactionalToolsNode
from agentlab.core.batch.timeouts import SET_STATEMENT_TIMEOUT
from agentlab.core.errors import DomainError
from agentlab.core.events import EventLog
from agentlab.core.messages import FAILED_PREFIX
from agentlab.core.safeguards import Policy, preset
from agentlab.core.toolspec import StrictArgs, Toolset, tool
from agentlab.domains.billing.tools import TOOLS, CreateInvoice, create_invoice
from conftest import scalar

STRATEGIES = pytest.mark.parametrize("strategy", [SavepointStrategy(), PipelinedStrategy()],
                                     ids=["reference", "pipelined"])
BUDGET_MS = 150
CREDIT = "SELECT credit_cents FROM customers WHERE id = 1"
LEDGER = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"


class Spend(StrictArgs):
    """Takes ``amount_cents`` off customer 1's credit, then works for ``seconds`` in the database."""

    amount_cents: int
    seconds: float


async def spend(conn, args, ctx) -> dict:
    await conn.execute("UPDATE customers SET credit_cents = credit_cents - %s WHERE id = 1", (args["amount_cents"],))
    await (await conn.execute("SELECT pg_sleep(%s)", (args["seconds"],))).fetchall()
    return {"spent": args["amount_cents"]}


async def spend_without_reading(conn, args, ctx) -> dict:
    """The same work, its results never read: in a pipeline the cancellation surfaces only at the next Sync."""
    await conn.execute("UPDATE customers SET credit_cents = credit_cents - %s WHERE id = 1", (args["amount_cents"],))
    await conn.execute("SELECT pg_sleep(%s)", (args["seconds"],))
    return {"spent": args["amount_cents"]}


def toolset() -> Toolset:
    return Toolset([
        *TOOLS.values(),
        tool(Spend, spend, writes=True, name="SpendQuickly", timeout_ms=BUDGET_MS),  # the budgeted tool
        tool(Spend, spend_without_reading, writes=True, name="SpendQuicklyBlind", timeout_ms=BUDGET_MS),
        tool(Spend, spend, writes=True, name="SpendSlowly"),  # no budget: the batch's statement_timeout (2 s)
        tool(CreateInvoice, create_invoice, writes=True, name="InvoiceQuickly", timeout_ms=BUDGET_MS),
    ])


def node_for(h, strategy, policy=Policy.ATOMIC):
    return TransactionalToolsNode(h.pool, preset("full").replace(policy=policy), toolset=toolset(),
                                  provider=h.provider, events=h.events, error_hints=h.domain.error_hints,
                                  strategy=strategy)


def call(name: str, cid: str, amount: int, seconds: float = 0.0) -> dict:
    return {"name": name, "args": {"amount_cents": amount, "seconds": seconds}, "id": cid, "type": "tool_call"}


@pytest.mark.parametrize("timeout_ms", [0, -1, True, 1.5, "100"])
def test_a_timeout_of_zero_or_less_or_not_whole_milliseconds_is_refused_when_the_tool_is_declared(timeout_ms):
    with pytest.raises(DomainError, match="SpendQuickly.*timeout_ms must be a whole number of milliseconds above"):
        tool(Spend, spend, writes=True, name="SpendQuickly", timeout_ms=timeout_ms)


@STRATEGIES
async def test_a_call_past_its_budget_is_cancelled_failed_timeout_and_under_atomic_nothing_is_stored(
        harness, strategy):
    batch = [call("SpendSlowly", "before", 100), call("SpendQuickly", "slow", 200, seconds=3),
             call("SpendSlowly", "after", 300)]
    t0 = time.perf_counter()
    result = await node_for(harness, strategy).run_batch(batch, thread_id="t-budget-atomic", tenant_id="acme")
    elapsed = time.perf_counter() - t0

    assert [r.outcome for r in result.results] == [Outcome.NOT_APPLIED, Outcome.FAILED, Outcome.NOT_APPLIED]
    slow = result.results[1]
    assert slow.content.startswith(f"{FAILED_PREFIX} [timeout]") and slow.translation.sqlstate == "57014"
    assert result.rolled_back
    assert elapsed < 2.0, "cancelled at its 150 ms budget, not at the batch's 2 s nor after its 3 s"
    assert await scalar(harness, CREDIT) == 5000
    assert await scalar(harness, LEDGER, ("t-budget-atomic",)) == 0


@STRATEGIES
@pytest.mark.parametrize("budgeted", ["SpendQuickly", "SpendQuicklyBlind"])
async def test_under_partial_the_cancelled_call_alone_is_undone_and_the_next_call_runs_under_the_batch_timeout(
        harness, strategy, budgeted):
    """ROLLBACK TO undoes the cancelled call's UPDATE and its SET LOCAL: the call after it sleeps 0.4 s, past the
    tool's 150 ms budget and within the batch's 2 s, and is applied (also when the cancelled tool read no result,
    so that on the pipelined path its cancellation is found with the next call's statements)."""
    batch = [call(budgeted, "slow", 200, seconds=3), call("SpendSlowly", "after", 300, seconds=0.4)]
    result = await node_for(harness, strategy, Policy.PARTIAL).run_batch(batch, thread_id="t-budget-partial",
                                                                          tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.FAILED, Outcome.APPLIED]
    assert result.results[0].category == "timeout"
    assert await scalar(harness, CREDIT) == 5000 - 300
    assert await scalar(harness, LEDGER, ("t-budget-partial",)) == 1


@STRATEGIES
async def test_a_call_within_its_budget_is_applied_and_its_budget_ends_with_it(harness, strategy):
    """RELEASE would keep the budgeted call's SET LOCAL; the batch's statement_timeout is restored before it,
    so the next call, 0.4 s long, is applied."""
    batch = [call("SpendQuickly", "quick", 200), call("SpendSlowly", "after", 300, seconds=0.4)]
    result = await node_for(harness, strategy).run_batch(batch, thread_id="t-budget-ok", tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.APPLIED, Outcome.APPLIED]
    assert await scalar(harness, CREDIT) == 5000 - 500
    assert await scalar(harness, LEDGER, ("t-budget-ok",)) == 2


DEFERRED_SLOW_CHECK = """
CREATE FUNCTION slow_commit_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_at_commit AFTER INSERT ON invoices
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit_check();
"""


@STRATEGIES
async def test_a_budget_never_reaches_commit_so_a_slow_commit_is_not_cancelled_and_the_call_is_applied(
        harness, strategy):
    """A deferred check takes 0.4 s at COMMIT, past the last call's 150 ms budget (on the pipelined path that
    call's statements and COMMIT share one Sync). The invoice is stored and the call reported APPLIED, never
    "not applied": the budget was restored before RELEASE, and PostgreSQL stops a statement's timer before it
    commits anyway (a COMMIT's deferred work is not cut short by ``statement_timeout``), so a budget, a
    server-side timer, cannot fire once COMMIT has begun."""
    async with harness.pool.connection() as conn:
        await conn.execute(DEFERRED_SLOW_CHECK)
    batch = [{"name": "InvoiceQuickly", "args": {"customer_id": 1, "billing_period": "2026-05-01",
                                                 "amount_cents": 1200}, "id": "inv", "type": "tool_call"}]
    result = await node_for(harness, strategy).run_batch(batch, thread_id="t-budget-commit", tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.APPLIED]
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 1") == 1
    assert await scalar(harness, LEDGER, ("t-budget-commit",)) == 1


async def test_both_strategies_send_the_same_statements_and_a_budget_costs_the_pipeline_no_round_trip(harness):
    batch = [call("SpendQuickly", "a", 1), call("SpendSlowly", "b", 1), call("SpendQuickly", "c", 1)]
    sent = {}
    for name, strategy in (("reference", SavepointStrategy()), ("pipelined", PipelinedStrategy())):
        async def run(pool, strategy=strategy, thread=f"t-budget-sql-{name}"):
            node = TransactionalToolsNode(pool, preset("full"), toolset=toolset(), events=EventLog(None),
                                          strategy=strategy)
            await node.run_batch(batch, thread_id=thread, tenant_id="acme")
        sent[name] = await traced_statements(harness.url, run)
    assert sent["reference"].statements == sent["pipelined"].statements
    assert sent["pipelined"].statements.count(SET_STATEMENT_TIMEOUT.replace("%s", "$1")) == 4  # set, restore x2
    # open 1; per call one round trip for SAVEPOINT + the UPDATE + the SELECT read; the last call's Sync with COMMIT
    assert sent["pipelined"].round_trips == 1 + 3 + 1
    assert await scalar(harness, CREDIT) == 5000 - 6
