"""Job state on a real PostgreSQL: a timeout after the work finished is never a second write.

The slow work is real: a trigger that sleeps in the business INSERT (``pg_sleep``). The client's
timeout is shorter than the sleep by a wide margin; every assertion reads the database.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from agentlab.durable.jobs import JobFailed, JobLost, JobStatus, JobStore, JobTimeout
from conftest import fetch, scalar

SLOW_INVOICES = """
CREATE FUNCTION slow_invoice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.8); RETURN NEW; END $$;
CREATE TRIGGER slow_invoice BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION slow_invoice();
"""


async def write_invoice(conn, args: dict) -> dict:
    cur = await conn.execute(
        "INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
        "SELECT tenant_id, id, %s, %s FROM customers WHERE id = %s RETURNING id",
        (args["billing_period"], args["amount_cents"], args["customer_id"]))
    return {"invoice_id": (await cur.fetchone())[0]}


ARGS = {"customer_id": 1, "billing_period": "2026-05-01", "amount_cents": 4200}


async def test_timed_out_but_done_job_is_not_written_twice(harness):
    async with harness.pool.connection() as conn:
        await conn.execute(SLOW_INVOICES)
    store = JobStore(harness.pool)
    calls = []

    async def work(conn, args):
        calls.append(args)
        return await write_invoice(conn, args)

    with pytest.raises(JobTimeout):  # the client gives up; the work goes on
        await store.run("invoice:1:2026-05", "invoice", ARGS, work, timeout_s=0.1)
    retry = await store.run("invoice:1:2026-05", "invoice", ARGS, work, timeout_s=10)
    again = await store.run("invoice:1:2026-05", "invoice", ARGS, work, timeout_s=10)
    await store.wait_idle()

    assert retry.replayed and again.replayed and retry.result == again.result
    assert len(calls) == 1
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE customer_id = 1") == 1
    rows = await fetch(harness, "SELECT status, attempt, result FROM jobs WHERE job_key = 'invoice:1:2026-05'")
    assert rows == [("succeeded", 1, retry.result)]
    invoice_id = await scalar(harness, "SELECT id FROM invoices WHERE customer_id = 1")
    assert retry.result == {"invoice_id": invoice_id}


async def test_two_succeeded_jobs_or_a_result_without_success_are_impossible(harness):
    store = JobStore(harness.pool)
    await store.run("k1", "invoice", ARGS, write_invoice)
    async with harness.pool.connection() as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute("INSERT INTO jobs (job_key, kind, args, status, attempt, result, finished_at) "
                               "VALUES ('k1', 'invoice', '{}', 'succeeded', 1, '{}', now())")
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute("INSERT INTO jobs (job_key, kind, args, status, result) "
                               "VALUES ('k2', 'invoice', '{}', 'running', '{}')")
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute("UPDATE jobs SET status = 'succeeded', result = NULL WHERE job_key = 'k1'")


async def test_a_worker_that_lost_its_claim_leaves_no_half_written_record(harness):
    store = JobStore(harness.pool, lease_s=0.0)  # every claim expires at once
    job = await store.submit("invoice:1:2026-06", "invoice", {**ARGS, "billing_period": "2026-06-01"})
    attempt = await store.claim(job)
    assert await store.expire_leases() == 1  # a stuck worker: its job becomes unknown
    assert (await store.get(job.job_key)).status is JobStatus.UNKNOWN
    with pytest.raises(JobLost):
        await store.execute(job, attempt, write_invoice)  # the old worker wakes up and tries to finish
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE billing_period = '2026-06-01'") == 0

    store.lease_s = 30.0
    done = await store.run(job.job_key, "invoice", job.args, write_invoice)
    assert not done.replayed and done.attempt == 2
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE billing_period = '2026-06-01'") == 1
    assert await fetch(harness, "SELECT status, attempt FROM jobs WHERE job_key = %s", (job.job_key,)) == [
        ("succeeded", 2)]


async def test_a_failed_job_keeps_its_history_and_a_retry_does_the_work(harness):
    store = JobStore(harness.pool)
    bad = {**ARGS, "amount_cents": -1}  # breaks the invoice CHECK: the attempt fails, its write rolls back
    with pytest.raises(JobFailed):
        await store.run("invoice:1:2026-07", "invoice", {**bad, "billing_period": "2026-07-01"}, write_invoice)
    ok = await store.run("invoice:1:2026-07", "invoice", {**ARGS, "billing_period": "2026-07-01"}, write_invoice)
    assert not ok.replayed
    rows = await fetch(harness, "SELECT status FROM jobs WHERE job_key = 'invoice:1:2026-07' ORDER BY id")
    assert rows == [("failed",), ("succeeded",)]
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE billing_period = '2026-07-01'") == 1


async def test_concurrent_clients_share_one_execution(harness):
    store = JobStore(harness.pool)
    calls = []

    async def work(conn, args):
        calls.append(1)
        await conn.execute("SELECT pg_sleep(0.2)")
        return await write_invoice(conn, args)

    args = {**ARGS, "billing_period": "2026-08-01"}
    results = await asyncio.gather(*[store.run("invoice:1:2026-08", "invoice", args, work, timeout_s=10)
                                     for _ in range(4)])
    assert len(calls) == 1
    assert sum(not r.replayed for r in results) == 1 and len({str(r.result) for r in results}) == 1
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE billing_period = '2026-08-01'") == 1


async def test_clients_waiting_on_a_failing_attempt_all_see_the_failure(harness):
    store = JobStore(harness.pool)

    async def failing(conn, args):
        await conn.execute("SELECT pg_sleep(0.1)")
        return await write_invoice(conn, {**args, "amount_cents": -1})  # breaks the invoice CHECK

    args = {**ARGS, "billing_period": "2026-09-01"}
    outcomes = await asyncio.wait_for(asyncio.gather(
        *[store.run("invoice:1:2026-09", "invoice", args, failing, timeout_s=10) for _ in range(3)],
        return_exceptions=True), timeout=20)
    assert all(isinstance(o, JobFailed) for o in outcomes)
    assert await fetch(harness, "SELECT status, attempt FROM jobs WHERE job_key = 'invoice:1:2026-09'") == [
        ("failed", 1)]
    assert await scalar(harness, "SELECT count(*) FROM invoices WHERE billing_period = '2026-09-01'") == 0


async def test_timeout_then_retry_story_reports_one_invoice(harness):
    from agentlab.durable.jobs import timeout_then_retry

    story = await timeout_then_retry(harness.pool, 2, "2026-10-01")
    assert story["first_call"].startswith("JobTimeout")
    assert story["retry_replayed"] and story["invoices"] == 1
    assert (story["job_rows"], story["job_status"], story["attempts"]) == (1, ["succeeded"], [1])
    assert await scalar(harness, "SELECT count(*) FROM pg_trigger WHERE tgname = 'agentlab_slow_invoice'") == 0
