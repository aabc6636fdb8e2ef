"""Case C12: pipeline results come late.

The node pipelines BEGIN, the prelude (settings, advisory lock) and the ledger look-up into one round
trip, and reports a call "applied" only once COMMIT has returned. Two ways this can go wrong:

A: COMMIT itself fails (here a deferred constraint trigger, checked only at COMMIT). Every call that
   had run is FAILED with the commit's reason, none is reported applied, the database is unchanged.
B: a pipelined batch-level statement fails (the thread's advisory lock is held by another session and
   ``lock_timeout`` expires). No tool call ran, so none is blamed: every call is NOT APPLIED.
"""

from __future__ import annotations

import psycopg

from agentlab.core.errors import find_leaks
from agentlab.core.messages import BATCH_ROLLED_BACK, FAILED_PREFIX, NOT_APPLIED_TEMPLATE
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from conftest import fetch, scalar

CALLS = [
    {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 100}, "id": "c1", "type": "tool_call"},
    {"name": "CreateInvoice", "args": {"customer_id": 1, "billing_period": "2026-05-01", "amount_cents": 1200},
     "id": "c2", "type": "tool_call"},
]

DEFERRED_TRIGGER = """
CREATE FUNCTION c12_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'invoice % refused at commit', NEW.id USING ERRCODE = 'check_violation';
END $$;
CREATE CONSTRAINT TRIGGER c12_at_commit AFTER INSERT ON invoices
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION c12_refuse();
"""


async def state(harness):
    credit = await scalar(harness, "SELECT credit_cents FROM customers WHERE id = 1")
    invoices = await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 1")
    ledger = await scalar(harness, "SELECT count(*) FROM tool_executions")
    return credit, invoices, ledger


async def no_transaction_left_open(harness) -> list[str]:
    """The states of the database's other client sessions, asserted to hold no transaction left open (``idle in
    transaction``, aborted or not): the batch's connection went back to the pool rolled back. A session that is
    ``active`` is another piece of work in flight (the events writer, a pool's check) on a loaded machine."""
    rows = await fetch(harness, "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    states = [s for (s,) in rows]
    assert states, "the pool's sessions should still be connected"
    assert not [s for s in states if s and s.startswith("idle in transaction")], states
    return states


async def test_c12_a_failed_commit_reports_no_call_applied(harness):
    async with harness.pool.connection() as conn:
        await conn.execute(DEFERRED_TRIGGER)
    before = await state(harness)

    result = await harness.node(preset("full")).run_batch(CALLS, thread_id="t-c12-a", tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.FAILED, Outcome.FAILED]
    assert result.rolled_back
    for r in result.results:
        assert r.content.startswith(f"{FAILED_PREFIX} [business_rule]")
        assert "could not be committed" in r.content
        assert find_leaks(r.content) == []
        assert "c12" not in r.content and "invoice" not in r.content
        assert r.translation.sqlstate == "23514"
    # nothing of the batch is in the database: no credit spent, no invoice, no ledger row
    assert await state(harness) == before == (5000, 0, 0)
    await harness.events.flush()
    events = await fetch(harness, "SELECT sqlstate FROM events WHERE thread_id = 't-c12-a' "
                                  "AND outcome = 'commit_failed'")
    assert events == [("23514",)]  # the full detail is logged once, for the batch
    await no_transaction_left_open(harness)


async def test_c12_a_after_a_failed_commit_the_same_calls_apply_once_fixed(harness):
    async with harness.pool.connection() as conn:
        await conn.execute(DEFERRED_TRIGGER)
    node = harness.node(preset("full"))
    await node.run_batch(CALLS, thread_id="t-c12-b", tenant_id="acme")
    async with harness.pool.connection() as conn:
        await conn.execute("DROP TRIGGER c12_at_commit ON invoices")

    again = await node.run_batch(CALLS, thread_id="t-c12-b", tenant_id="acme", attempt=2)

    # the failed commit left no ledger row behind, so the calls run now (not replayed from a lost commit)
    assert [r.outcome for r in again.results] == [Outcome.APPLIED, Outcome.APPLIED]
    assert await state(harness) == (4900, 1, 2)


async def test_c12_b_a_failed_pipelined_prelude_blames_no_call(harness):
    before = await state(harness)
    holder = await psycopg.AsyncConnection.connect(harness.url, autocommit=True)
    try:
        await holder.execute("SELECT pg_advisory_lock(hashtextextended('t-c12-c', 0))")
        sg = preset("full").replace(lock_timeout_ms=50)
        result = await harness.node(sg).run_batch(CALLS, thread_id="t-c12-c", tenant_id="acme",
                                                  final_attempt=True)
    finally:
        await holder.close()

    assert [r.outcome for r in result.results] == [Outcome.NOT_APPLIED, Outcome.NOT_APPLIED]
    assert result.rolled_back
    for r in result.results:
        assert r.content.startswith("NOT APPLIED")
        assert find_leaks(r.content) == []
    assert await state(harness) == before == (5000, 0, 0)
    await no_transaction_left_open(harness)


async def test_c12_b_a_call_after_the_pipeline_is_blamed_alone(harness):
    """The pipeline's results are all read before the first call runs: an error in call 2 is call 2's."""
    calls = [CALLS[0], {**CALLS[1], "args": {**CALLS[1]["args"], "customer_id": 999}}]
    result = await harness.node(preset("full").replace(policy="partial")).run_batch(
        calls, thread_id="t-c12-d", tenant_id="acme")

    assert [r.outcome for r in result.results] == [Outcome.APPLIED, Outcome.FAILED]
    assert result.results[1].content.startswith(f"{FAILED_PREFIX} [not_found]")
    assert await state(harness) == (4900, 0, 1)
    assert NOT_APPLIED_TEMPLATE.format(reason=BATCH_ROLLED_BACK) not in [r.content for r in result.results]
