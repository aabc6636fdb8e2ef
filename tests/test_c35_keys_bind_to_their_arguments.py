"""C35: job keys and saga run keys bind to their arguments.

The same key with other arguments (or another kind of job, or another saga) is refused with one
clear error and runs nothing; the same key with the same arguments returns the stored result.
"""

from __future__ import annotations

import pytest

from agentlab.demos.payout_saga import notice_model, payout_effects, payout_input, store_credit_payout
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.jobs import JobKeyConflict, JobStatus, JobStore, create_invoice_job
from agentlab.durable.saga import Backoff, SagaDefinition, SagaError, SagaRunner, Step
from conftest import fetch, scalar

KEY = "invoice:1:2026-05-01"
ARGS = {"customer_id": 1, "billing_period": "2026-05-01", "amount_cents": 4200}
OTHER = {**ARGS, "amount_cents": 9900}
INVOICES = "SELECT amount_cents FROM invoices WHERE customer_id = 1 AND billing_period = '2026-05-01' ORDER BY id"


async def test_c35_a_job_key_with_other_arguments_or_kind_is_refused_and_runs_nothing(harness):
    store = JobStore(harness.pool)
    first = await store.run(KEY, "invoice", ARGS, create_invoice_job)
    assert first.replayed is False

    with pytest.raises(JobKeyConflict, match="another kind or other arguments") as refused:
        await store.run(KEY, "invoice", OTHER, create_invoice_job)
    assert refused.value.job_key == KEY and "9900" not in str(refused.value) and "4200" not in str(refused.value)
    with pytest.raises(JobKeyConflict):
        await store.run(KEY, "credit_memo", ARGS, create_invoice_job)
    assert await fetch(harness, INVOICES) == [(4200,)]
    assert await scalar(harness, "SELECT count(*) FROM jobs WHERE job_key = %s", (KEY,)) == 1

    again = await store.run(KEY, "invoice", dict(reversed(list(ARGS.items()))), create_invoice_job)
    assert (again.replayed, again.result, again.attempt) == (True, first.result, 1)  # key order does not matter
    assert await fetch(harness, INVOICES) == [(4200,)]


async def test_c35_a_second_client_cannot_take_over_a_dead_clients_job_with_other_arguments(harness):
    store = JobStore(harness.pool, lease_s=0.2)
    job = await store.submit(KEY, "invoice", ARGS)
    assert await store.claim(job) == 1  # the first client claimed it, then died before doing the work

    with pytest.raises(JobKeyConflict):
        await store.run(KEY, "invoice", OTHER, create_invoice_job)
    assert await fetch(harness, INVOICES) == []
    assert await scalar(harness, "SELECT status FROM jobs WHERE job_key = %s", (KEY,)) == JobStatus.RUNNING.value

    done = await store.run(KEY, "invoice", ARGS, create_invoice_job, timeout_s=5)  # the lease runs out, then it runs
    assert (done.replayed, done.attempt) == (False, 2)
    assert await fetch(harness, INVOICES) == [(4200,)]


async def test_c35_a_saga_run_key_with_a_new_amount_or_another_saga_is_refused(harness):
    async with harness.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", "Keys", 5000)], "public")
    fast = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=2, initial_s=0.01)}
    runner = SagaRunner(harness.pool, store_credit_payout(notice_model()), **fast)
    first = await runner.start("payout-c35", payout_input(cid, 2000, "SC-35"))
    assert first.status == "completed"

    with pytest.raises(SagaError, match=r"payout-c35.*was started with another input"):
        await runner.start("payout-c35", payout_input(cid, 9900, "SC-35"))

    async def noop(ctx):
        return {}

    other = SagaRunner(harness.pool, SagaDefinition("other_saga", (Step("noop", noop),)), **fast)
    with pytest.raises(SagaError, match="belongs to another saga"):
        await other.start("payout-c35", payout_input(cid, 2000, "SC-35"))

    again = await runner.start("payout-c35", payout_input(cid, 2000, "SC-35"))
    assert (again.run_id, again.status) == (first.run_id, "completed")
    assert await fetch(harness, "SELECT saga, input->>'amount_cents' FROM saga_runs") == [
        ("store_credit_payout", "2000")]
    effects = await payout_effects(harness, cid, 5000)
    assert (effects["credit_deducted_cents"], effects["refunds_at_provider"], effects["refunded_cents"]) == (
        2000, 1, 2000)
