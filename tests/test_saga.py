"""Sagas on a real PostgreSQL: order of compensations, escalation, forward recovery, crash recovery.

Faults are real: a refund that exists already (a natural key), a balance too low (a CHECK), and a
second session holding a customer's row (``lock_timeout``). Every assertion reads the database.
"""

from __future__ import annotations

import matplotlib
import psycopg
import pytest

from agentlab.core.errors import SimulatedCrash
from agentlab.demos.payout_saga import (
    backward_recovery,
    escalation,
    forward_recovery,
    notice_model,
    payout_effects,
    payout_input,
    payout_script,
    store_credit_payout,
)
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.saga import Backoff, SagaBusy, SagaDefinition, SagaRunner, Step, StepContext
from agentlab.durable.saga_frames import saga_chart, saga_log_frame
from agentlab.lab.row_lock import RowLock
from conftest import fetch, scalar

matplotlib.use("Agg")

FAST = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.01),
        "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}
OPENING = 5000


async def customers(h, n: int = 1, credit_cents: int = OPENING) -> list[int]:
    async with h.pool.connection() as conn:
        return await create_customers(conn, [CustomerSpec("acme", f"Saga {i}", credit_cents) for i in range(n)],
                                      "public")


async def credit(h, customer_id: int) -> int:
    return await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (customer_id,))


async def test_failing_fourth_step_compensates_steps_three_two_one_in_that_order(harness):
    (cid,) = await customers(harness)
    rep = await backward_recovery(harness, store_credit_payout(notice_model()), cid, 3000, "SC-1", **FAST)

    order = await fetch(harness, "SELECT position FROM saga_log WHERE run_id = %s "
                                 "AND action IN ('compensated', 'sent_but_unwound') ORDER BY id", (rep.run_id,))
    assert [r[0] for r in order] == [3, 2, 1]
    steps = await fetch(harness, "SELECT position, status FROM saga_steps WHERE run_id = %s ORDER BY position",
                        (rep.run_id,))
    assert steps == [(1, "compensated"), (2, "compensated"), (3, "sent_but_unwound"), (4, "failed")]
    assert await scalar(harness, "SELECT status FROM saga_runs WHERE id = %s", (rep.run_id,)) == "compensated"
    assert await credit(harness, cid) == OPENING  # the held credit was given back
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1  # the earlier one
    assert await scalar(harness, "SELECT count(*) FROM compensation_needed") == 0

    log = await saga_log_frame(harness.pool, rep.run_id)
    ax = saga_chart(log).axes[0]
    assert sum(len(c.get_offsets()) for c in ax.collections) == 7  # 3 completed, 1 failed, 3 compensations
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1 hold_credit", "2 write_notice", "3 notify_customer",
                                                           "4 queue_refund"]

    await harness.worker.drain()
    sent = await harness.notifier.messages(f"customer-{cid}@example.com")
    assert len(sent) == 2  # the notice went out; it is corrected, not pretended unsent
    assert sent[1]["corrects"] == sent[0]["reference"] and sent[0]["corrects"] is None


async def test_failing_compensation_stops_and_leaves_one_compensation_needed_row(harness):
    ids = await customers(harness, 4)

    async def hold(ctx: StepContext) -> dict:
        cid, amount = ctx.input["holds"][ctx.position - 1]
        async with ctx.conn.cursor() as cur:
            await cur.execute("UPDATE customers SET credit_cents = credit_cents - %s WHERE id = %s", (amount, cid))
        return {"customer_id": cid, "amount_cents": amount}

    async def give_back(ctx: StepContext, args: dict) -> None:
        await ctx.conn.execute("UPDATE customers SET credit_cents = credit_cents + %s WHERE id = %s",
                               (args["amount_cents"], args["customer_id"]))

    saga = SagaDefinition("four_holds", tuple(Step(f"hold_{i}", hold, give_back) for i in range(1, 5)))
    runner = SagaRunner(harness.pool, saga, **FAST)
    locks: list[RowLock] = []

    async def lock_second_customer(position, attempt, exc):
        if position == 4:  # step 4 broke the CHECK; now another session holds step 2's row
            locks.append(await RowLock.acquire(harness.url, ids[1]))

    runner.hooks.after_failure.append(lock_second_customer)
    holds = [[ids[0], 1000], [ids[1], 1000], [ids[2], 1000], [ids[3], OPENING + 1]]
    try:
        rep = await runner.start("holds-1", {"holds": holds})
        again = await runner.resume(rep.run_id)  # a second try while the row is still busy
    finally:
        for lock in locks:
            await lock.release()

    assert rep.status == again.status == "parked"
    order = await fetch(harness, "SELECT position, action FROM saga_log WHERE run_id = %s AND position IS NOT NULL "
                                 "AND action <> 'completed' ORDER BY id", (rep.run_id,))
    assert [p for p, a in order if a == "compensated"] == [3]  # stopped at 2: step 1 was never compensated
    steps = dict(await fetch(harness, "SELECT position, status FROM saga_steps WHERE run_id = %s", (rep.run_id,)))
    assert steps == {1: "completed", 2: "compensation_failed", 3: "compensated", 4: "failed"}
    needed = await fetch(harness, "SELECT position, step, status FROM compensation_needed WHERE run_id = %s",
                         (rep.run_id,))
    assert needed == [(2, "hold_2", "open")]
    assert [await credit(harness, c) for c in ids] == [OPENING - 1000, OPENING - 1000, OPENING, OPENING]

    # a person frees the row and resumes: the compensation finishes, the one row is resolved
    done = await runner.resume(rep.run_id)
    assert done.status == "compensated"
    assert await fetch(harness, "SELECT status FROM compensation_needed WHERE run_id = %s", (rep.run_id,)) == [
        ("resolved",)]
    assert [await credit(harness, c) for c in ids] == [OPENING] * 4


async def test_escalation_story_parks_the_run_with_its_reason(harness):
    (cid,) = await customers(harness)
    rep = await escalation(harness, store_credit_payout(notice_model()), cid, 3000, "SC-2", **FAST)
    assert rep.status == "parked"
    assert "compensation of step 1 (hold_credit)" in rep.parked_reason
    assert await scalar(harness, "SELECT count(*) FROM compensation_needed WHERE status = 'open'") == 1
    assert rep.compensations == [3, 2]
    assert await credit(harness, cid) == OPENING - 3000  # still held: a person must look
    resumed = await SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST).resume(rep.run_id)
    assert resumed.status == "compensated" and resumed.compensations == [3, 2, 1]
    assert await credit(harness, cid) == OPENING


async def test_forward_recovery_retries_only_the_failed_step(harness):
    (cid,) = await customers(harness)
    model = notice_model()
    rep = await forward_recovery(harness, store_credit_payout(model), cid, 3000, "SC-3", **FAST)

    assert rep.status == "completed"
    attempts = await fetch(harness, "SELECT position, attempts FROM saga_steps WHERE run_id = %s ORDER BY position",
                           (rep.run_id,))
    assert attempts == [(1, 1), (2, 1), (3, 1), (4, 2)]
    failures = await fetch(harness, "SELECT position, error_class FROM saga_log "
                                    "WHERE run_id = %s AND action = 'failed'", (rep.run_id,))
    assert failures == [(4, "psycopg.errors.LockNotAvailable")]
    assert await scalar(harness, "SELECT count(*) FROM saga_log WHERE run_id = %s AND step = 'write_notice' "
                                 "AND action = 'started'", (rep.run_id,)) == 1
    assert model._invocations == 1  # the expensive call was made once
    assert await credit(harness, cid) == OPENING - 3000
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM outbox WHERE thread_id = %s", (f"saga:{rep.run_id}",)) == 2


async def test_transient_failures_past_their_attempts_park_the_run_then_resume_finishes(harness):
    (cid,) = await customers(harness)
    model = notice_model()
    saga = store_credit_payout(model)
    runner = SagaRunner(harness.pool, saga, lock_timeout_ms=50, retry=Backoff(max_attempts=2, initial_s=0.01))
    locks: list[RowLock] = []

    async def busy(position, name):
        if position == 3:
            locks.append(await RowLock.acquire(harness.url, cid))

    runner.hooks.after_step.append(busy)
    try:
        rep = await runner.start("payout-parked", payout_input(cid, 1000, "SC-4"))
    finally:
        for lock in locks:
            await lock.release()
    assert rep.status == "parked" and rep.direction == "forward"
    assert "step 4 (queue_refund) still failing after 2 attempts" in rep.parked_reason
    done = await runner.resume(rep.run_id)
    assert done.status == "completed"
    assert [s["attempts"] for s in done.steps] == [1, 1, 1, 3]
    assert model._invocations == 1


async def test_recovery_after_a_crash_does_not_repeat_the_model_call(harness):
    (cid,) = await customers(harness)
    first_model = notice_model()
    runner = SagaRunner(harness.pool, store_credit_payout(first_model), **FAST)

    def crash_after_notice(position, name):
        if position == 2:
            raise SimulatedCrash("the process dies after the notice was stored")

    runner.hooks.after_step.append(crash_after_notice)
    with pytest.raises(SimulatedCrash):
        await runner.start("payout-crash", payout_input(cid, 1000, "SC-5"))
    run_id = await scalar(harness, "SELECT id FROM saga_runs WHERE run_key = 'payout-crash'")
    assert await scalar(harness, "SELECT status FROM saga_runs WHERE id = %s", (run_id,)) == "running"

    second_model = notice_model()  # a new process: a new model client
    rep = await SagaRunner(harness.pool, store_credit_payout(second_model), **FAST).resume(run_id)
    assert rep.status == "completed"
    assert (first_model._invocations, second_model._invocations) == (1, 0)
    assert await scalar(harness, "SELECT count(*) FROM saga_log WHERE run_id = %s AND step = 'write_notice' "
                                 "AND action = 'started'", (run_id,)) == 1


async def test_starting_the_same_run_key_twice_runs_it_once(harness):
    (cid,) = await customers(harness)
    model = notice_model()
    runner = SagaRunner(harness.pool, store_credit_payout(model), **FAST)
    a = await runner.start("payout-once", payout_input(cid, 1000, "SC-6"))
    b = await runner.start("payout-once", payout_input(cid, 1000, "SC-6"))
    assert a.run_id == b.run_id and b.status == "completed"
    assert await scalar(harness, "SELECT count(*) FROM saga_runs") == 1
    assert await credit(harness, cid) == OPENING - 1000
    assert model._invocations == 1


async def test_a_second_runner_on_the_same_run_is_refused(harness):
    (cid,) = await customers(harness)
    runner = SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST)
    held: list = []

    async def second_runner(position, name):
        if position == 1:
            with pytest.raises(SagaBusy):
                await SagaRunner(harness.pool, runner.saga, **FAST).resume(
                    await scalar(harness, "SELECT id FROM saga_runs"))
            held.append(True)

    runner.hooks.after_step.append(second_runner)
    rep = await runner.start("payout-busy", payout_input(cid, 1000, "SC-7"))
    assert held == [True] and rep.status == "completed"


async def test_a_saga_run_survives_the_check_constraint_as_a_permanent_failure(harness):
    (cid,) = await customers(harness, credit_cents=100)
    rep = await SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST).start(
        "payout-too-much", payout_input(cid, 3000, "SC-8"))
    assert rep.status == "compensated" and rep.failed_step == 1 and rep.compensations == []
    assert await scalar(harness, "SELECT error_class FROM saga_log WHERE action = 'failed'") == (
        "psycopg.errors.CheckViolation")
    assert await credit(harness, cid) == 100
    with pytest.raises(psycopg.errors.UniqueViolation):  # the database holds one open row per run
        async with harness.pool.connection() as conn:
            for _ in range(2):
                await conn.execute("INSERT INTO compensation_needed (run_id, position, step, action, reason) "
                                   "VALUES (%s, 1, 'hold_credit', '{}', 'test')", (rep.run_id,))


@pytest.mark.parametrize("fault,outcome,errors,refunds", [
    ("busy_row", "completed", ["LockNotAvailable"], 1),
    ("already_refunded", "gave up", ["UniqueViolation", "UniqueViolation"], 0),
])
async def test_a_script_retried_from_step_one_repeats_every_completed_step(harness, fault, outcome, errors, refunds):
    (cid,) = await customers(harness)
    model = notice_model()
    result = await payout_script(harness, store_credit_payout(model), cid, 2000, "SC-7", fault=fault)
    assert result == {"attempts": 2, "outcome": outcome, "errors": errors, "model_calls": 2}
    assert model._invocations == 2
    assert await payout_effects(harness, cid, OPENING) == {
        "credit_deducted_cents": 4000, "refunds_at_provider": refunds, "refunded_cents": 2000 * refunds,
        "notices_sent": 2, "corrections_sent": 0,
    }
    assert await credit(harness, cid) == OPENING - 4000  # read directly: the credit was held twice
    assert await scalar(harness, "SELECT count(*) FROM saga_runs") == 0  # a script leaves no run behind


@pytest.mark.parametrize("play,expected", [
    (forward_recovery, {"credit_deducted_cents": 2000, "refunds_at_provider": 1, "refunded_cents": 2000,
                        "notices_sent": 1, "corrections_sent": 0}),
    (backward_recovery, {"credit_deducted_cents": 0, "refunds_at_provider": 0, "refunded_cents": 0,
                         "notices_sent": 1, "corrections_sent": 1}),
])
async def test_payout_effects_of_the_saga_under_the_same_faults(harness, play, expected):
    (cid,) = await customers(harness)
    await play(harness, store_credit_payout(notice_model()), cid, 2000, "SC-8", **FAST)
    assert await payout_effects(harness, cid, OPENING) == expected


async def test_a_script_without_a_fault_completes_once_and_an_unknown_fault_is_refused(harness):
    (cid,) = await customers(harness)
    saga = store_credit_payout(notice_model())
    assert (await payout_script(harness, saga, cid, 1000, "SC-9"))["attempts"] == 1
    assert (await payout_effects(harness, cid, OPENING))["credit_deducted_cents"] == 1000
    with pytest.raises(ValueError, match="busy_row"):
        await payout_script(harness, saga, cid, 1000, "SC-10", fault="meteor")
