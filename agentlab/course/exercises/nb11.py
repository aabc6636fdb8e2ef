"""Exercises of notebook 11 (sagas): a crash after the expensive step, a parked run aborted by a person."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="11.1", title="A crash after the expensive step", function="crash_after_notice",
        solution="agentlab.course.solutions.ex11_sagas:crash_after_notice",
        cases=(Case(expected={"status_after_crash": "running", "status_after_resume": "completed", "model_calls": 1,
                              "notices_sent": 1, "credit_deducted_cents": 2000}),),
        hints={
            "status_after_crash": "SELECT status FROM saga_runs WHERE run_key = %s, right after runner.start "
                                  "raised SimulatedCrash (catch it)",
            "status_after_resume": "a new SagaRunner(h.pool, store_credit_payout(notice_model()), **RUNNER)"
                                   ".resume(run_id); the report's .status",
            "model_calls": "count the journal's (saga_log) rows of the run with step 'write_notice' and action "
                           "'started', or use model_calls(run_id) from the notebook",
            "notices_sent": "(await payout_effects(h, customer, 5000))['notices_sent']",
            "credit_deducted_cents": "(await payout_effects(h, customer, 5000))['credit_deducted_cents']",
            "*": "the hook is a plain function hook(position, name) appended to runner.hooks.after_step; raise "
                 "SimulatedCrash in it when position == 2",
        },
    ),
    Exercise(
        id="11.2", title="Parked going forward, then aborted by a person", function="abort_parked_run",
        solution="agentlab.course.solutions.ex11_sagas:abort_parked_run",
        cases=(Case(expected={
            "parked_reason": "step 4 (queue_refund) still failing after 2 attempts: psycopg.errors.LockNotAvailable",
            "after_abort": "compensated", "compensations": [3, 2, 1], "credit_deducted_cents": 0, "notices_sent": 1,
            "corrections_sent": 1}),),
        hints={
            "parked_reason": "SagaRunner(h.pool, SAGA, lock_timeout_ms=100, retry=Backoff(max_attempts=2, "
                             "initial_s=0.05)); the report runner.start returns has .parked_reason",
            "after_abort": "(await runner.abort(report.run_id, 'a reason')).status",
            "compensations": "the abort's report .compensations, in the order they ran",
            "*": "an async hook(position, name) on runner.hooks.after_step takes await RowLock.acquire(h.url, "
                 "customer) at position 3; release it (await lock.release()) after runner.start returned",
        },
    ),
)
