"""Exercises of notebook 11 (sagas and the three recoveries)."""

from __future__ import annotations

from agentlab import (
    Backoff,
    RowLock,
    SagaRunner,
    SimulatedCrash,
    new_customer,
    notice_model,
    payout_effects,
    payout_input,
    store_credit_payout,
)

OPENING_CENTS = 5000
RUNNER = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.05),
          "compensation_retry": Backoff(max_attempts=2, initial_s=0.05)}
RUN_STATUS = "SELECT status FROM saga_runs WHERE run_key = %s"
MODEL_CALLS = """
SELECT count(*) AS n FROM saga_log l JOIN saga_runs r ON r.id = l.run_id
WHERE r.run_key = %s AND l.step = 'write_notice' AND l.action = 'started'
"""


async def crash_after_notice(h, amount_cents: int = 2000) -> dict:
    """Exercise 11.1: the process dies right after step 2 (the model call) stored its result; a new
    process (a new runner, a new model client) resumes the run."""
    customer = await new_customer(h, OPENING_CENTS)
    run_key = f"ex11-crash:{customer}"
    runner = SagaRunner(h.pool, store_credit_payout(notice_model()), **RUNNER)

    def die_after_the_notice(position, name):
        if position == 2:
            raise SimulatedCrash("the process died after the notice was written")

    runner.hooks.after_step.append(die_after_the_notice)
    try:
        await runner.start(run_key, payout_input(customer, amount_cents, f"SC-{customer}"))
    except SimulatedCrash:
        pass
    after_crash = (await h.df(RUN_STATUS, (run_key,))).status[0]
    run_id = int((await h.df("SELECT id FROM saga_runs WHERE run_key = %s", (run_key,))).id[0])
    report = await SagaRunner(h.pool, store_credit_payout(notice_model()), **RUNNER).resume(run_id)
    effects = await payout_effects(h, customer, OPENING_CENTS)
    return {
        "status_after_crash": after_crash,
        "status_after_resume": report.status,
        "model_calls": int((await h.df(MODEL_CALLS, (run_key,))).n[0]),
        "notices_sent": effects["notices_sent"],
        "credit_deducted_cents": effects["credit_deducted_cents"],
    }


async def abort_parked_run(h, amount_cents: int = 2000) -> dict:
    """Exercise 11.2: step 4 meets a busy row on every attempt, so the run is parked going forward; the
    other session lets go, and a person decides to give up: :meth:`SagaRunner.abort`."""
    customer = await new_customer(h, OPENING_CENTS)
    runner = SagaRunner(h.pool, store_credit_payout(notice_model()), lock_timeout_ms=100,
                        retry=Backoff(max_attempts=2, initial_s=0.05))
    lock: list[RowLock] = []

    async def busy_before_the_refund(position, name):
        if position == 3:
            lock.append(await RowLock.acquire(h.url, customer))

    runner.hooks.after_step.append(busy_before_the_refund)
    try:
        parked = await runner.start(f"ex11-abort:{customer}", payout_input(customer, amount_cents, f"SC-{customer}"))
    finally:
        for held in lock:
            await held.release()
    aborted = await runner.abort(parked.run_id, "the customer asked for store credit instead")
    effects = await payout_effects(h, customer, OPENING_CENTS)
    return {
        "parked_reason": parked.parked_reason,
        "after_abort": aborted.status,
        "compensations": aborted.compensations,
        "credit_deducted_cents": effects["credit_deducted_cents"],
        "notices_sent": effects["notices_sent"],
        "corrections_sent": effects["corrections_sent"],
    }
