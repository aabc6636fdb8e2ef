"""C31: aborting a saga whose pivot step (the point of no return) already committed.

The process dies right after step 4 (``queue_refund``: money paid out, nothing undoes it) commits,
before the run row says completed; an operator who sees the run stuck in ``running`` calls abort.
Abort must be refused (the refund cannot be taken back) and the run finished going forward: the
credit stays deducted once, one refund reaches the provider, the customer gets no correction.
"""

from __future__ import annotations

import pytest

from agentlab.core.errors import NotFound, SimulatedCrash
from agentlab.demos.payout_saga import notice_model, payout_effects, payout_input, store_credit_payout
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.saga import AbortRefused, Backoff, SagaDefinition, SagaRunner, Step, StepContext
from conftest import fetch, scalar

FAST = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.01),
        "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}
OPENING, AMOUNT = 5000, 2000


async def customer(h, credit_cents: int = OPENING) -> int:
    async with h.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", "Pivot", credit_cents)], "public")
    return cid


async def test_c31_abort_after_point_of_no_return_is_refused_and_the_run_finishes_forward(harness):
    cid = await customer(harness)
    runner = SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST)

    def die_after_the_refund(position, name):
        if position == 4:
            raise SimulatedCrash("the process dies after step 4 committed")

    runner.hooks.after_step.append(die_after_the_refund)
    with pytest.raises(SimulatedCrash):
        await runner.start("payout-c31", payout_input(cid, AMOUNT, "SC-31"))
    run_id = await scalar(harness, "SELECT id FROM saga_runs WHERE run_key = 'payout-c31'")
    assert await scalar(harness, "SELECT status FROM saga_runs WHERE id = %s", (run_id,)) == "running"

    operator = SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST)
    with pytest.raises(AbortRefused, match=r"step 4 \(queue_refund\) is its point of no return"):
        await operator.abort(run_id, "stuck in running")
    # nothing moved: the run still goes forward, every step stays completed, the refusal is journaled
    assert await fetch(harness, "SELECT status, direction FROM saga_runs WHERE id = %s", (run_id,)) == [
        ("running", "forward")]
    assert await fetch(harness, "SELECT status FROM saga_steps WHERE run_id = %s ORDER BY position",
                       (run_id,)) == [("completed",)] * 4
    assert await fetch(harness, "SELECT position, action, detail FROM saga_log WHERE run_id = %s "
                                "AND action IN ('abort_refused', 'aborted', 'compensated')", (run_id,)) == [
        (4, "abort_refused", "stuck in running")]

    done = await operator.resume(run_id)
    assert done.status == "completed" and done.compensations == []
    assert await payout_effects(harness, cid, OPENING) == {
        "credit_deducted_cents": AMOUNT, "refunds_at_provider": 1, "refunded_cents": AMOUNT,
        "notices_sent": 1, "corrections_sent": 0,
    }
    sent = await harness.notifier.messages(f"customer-{cid}@example.com")
    assert [m["corrects"] for m in sent] == [None]
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1
    assert (await operator.abort(run_id, "again")).status == "completed"  # a finished run is left as it is
    assert await scalar(harness, "SELECT count(*) FROM saga_log WHERE run_id = %s AND action = 'compensated'",
                        (run_id,)) == 0


async def test_c31_a_permanent_failure_after_the_pivot_parks_the_run_instead_of_compensating(harness):
    cid = await customer(harness)
    broken = {"on": True}

    async def hold(ctx: StepContext) -> dict:
        await ctx.conn.execute("UPDATE customers SET credit_cents = credit_cents - 100 WHERE id = %s",
                               (ctx.input["customer_id"],))
        return {"held": 100}

    async def give_back(ctx: StepContext, args: dict) -> None:
        await ctx.conn.execute("UPDATE customers SET credit_cents = credit_cents + 100 WHERE id = %s",
                               (ctx.input["customer_id"],))

    async def pay(ctx: StepContext) -> dict:
        await ctx.conn.execute("INSERT INTO refunds (tenant_id, customer_id, reference, amount_cents) "
                               "SELECT tenant_id, id, 'PIVOT', 100 FROM customers WHERE id = %s",
                               (ctx.input["customer_id"],))
        return {"paid": 100}

    async def record(ctx: StepContext) -> dict:
        if broken["on"]:
            raise NotFound("the ledger entry's account does not exist yet")
        return {"recorded": True}

    saga = SagaDefinition("hold_pay_record", (Step("hold", hold, give_back), Step("pay", pay, None, pivot=True),
                                              Step("record", record)))
    runner = SagaRunner(harness.pool, saga, **FAST)
    rep = await runner.start("pivot-then-fail", {"customer_id": cid})
    assert rep.status == "parked" and rep.direction == "forward" and rep.compensations == []
    assert "step 3 (record) failed permanently after the point of no return, step 2 (pay)" in rep.parked_reason
    assert await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,)) == OPENING - 100
    with pytest.raises(AbortRefused):
        await runner.abort(rep.run_id, "give up")

    broken["on"] = False  # a person fixes the cause
    done = await runner.resume(rep.run_id)
    assert done.status == "completed"
    assert [s["status"] for s in done.steps] == ["completed"] * 3
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1


def test_c31_a_pivot_step_with_a_compensation_is_refused():
    async def noop(ctx):
        return {}

    with pytest.raises(ValueError, match="pivot step cannot be undone"):
        SagaDefinition("bad", (Step("pay", noop, noop, pivot=True),))
