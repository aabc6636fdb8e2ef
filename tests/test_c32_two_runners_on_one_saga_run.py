"""C32: two runners on one saga run.

Runner A is in its backoff before retrying step 4 when the backend holding its session advisory
lock is terminated (``pg_terminate_backend``, the kit's own fault); runner B then gets the lock and
aborts. B compensates steps 3, 2, 1; A's retry of step 4 must not commit: every step transaction
locks the run row and checks the owner token (fencing), so A is refused with :class:`SagaFenced`.
"""

from __future__ import annotations

import contextlib

import pytest

from agentlab.demos.payout_saga import notice_model, payout_effects, payout_input, store_credit_payout
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.saga import Backoff, SagaFenced, SagaRunner
from agentlab.lab.faults import TERMINATE
from agentlab.lab.row_lock import RowLock
from conftest import fetch, scalar

FAST = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.01),
        "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}
OPENING, AMOUNT = 5000, 2000
ADVISORY_HOLDERS = """
SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


async def test_c32_two_runners_on_one_saga_run_the_one_that_lost_its_lock_cannot_commit(harness):
    async with harness.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", "Two runners", OPENING)], "public")
    saga = store_credit_payout(notice_model())
    a, b = SagaRunner(harness.pool, saga, **FAST), SagaRunner(harness.pool, saga, **FAST)
    held: list[RowLock] = []
    seen: dict = {}

    async def busy_before_the_refund(position, name):
        if position == 3:
            held.append(await RowLock.acquire(harness.url, cid))

    async def lose_the_lock_while_backing_off(position, attempt, exc):
        if position != 4 or seen:
            return
        while held:
            await held.pop().release()
        pids = await fetch(harness, ADVISORY_HOLDERS)
        assert len(pids) == 1  # A's lock, on a session of its own
        seen["terminated"] = await scalar(harness, TERMINATE, (pids[0][0],))
        run_id = await scalar(harness, "SELECT id FROM saga_runs WHERE run_key = 'payout-c32'")
        seen["b"] = await b.abort(run_id, "an operator saw the run stuck")

    a.hooks.after_step.append(busy_before_the_refund)
    a.hooks.after_failure.append(lose_the_lock_while_backing_off)
    try:
        with pytest.raises(SagaFenced, match="claimed by another runner"):
            await a.start("payout-c32", payout_input(cid, AMOUNT, "SC-32"))
    finally:
        while held:
            await held.pop().release()

    assert seen["terminated"] is True
    run_id = seen["b"].run_id
    assert seen["b"].status == "compensated" and seen["b"].compensations == [3, 2, 1]
    assert await fetch(harness, "SELECT status, direction FROM saga_runs WHERE id = %s", (run_id,)) == [
        ("compensated", "backward")]
    assert await fetch(harness, "SELECT position, status FROM saga_steps WHERE run_id = %s ORDER BY position",
                       (run_id,)) == [(1, "compensated"), (2, "compensated"), (3, "sent_but_unwound"), (4, "failed")]
    assert await scalar(harness, "SELECT count(*) FROM saga_log WHERE run_id = %s AND position = 4 "
                                 "AND action = 'completed'", (run_id,)) == 0
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 0
    assert await payout_effects(harness, cid, OPENING) == {
        "credit_deducted_cents": 0, "refunds_at_provider": 0, "refunded_cents": 0,
        "notices_sent": 1, "corrections_sent": 1,
    }
    # the pool still works after A's lock connection died: a new runner reads the finished run
    assert (await SagaRunner(harness.pool, saga, **FAST).resume(run_id)).status == "compensated"


class _ReentrantLockRunner(SagaRunner):
    """A runner whose advisory lock gives no exclusivity, as behind a transaction-mode pooler (PgBouncer
    ``pool_mode = transaction``), where both runners' session locks land on one shared server session
    and are re-entrant. Only the fencing is left to keep the runs apart."""

    @contextlib.asynccontextmanager
    async def _run_lock(self, run_id: int):
        yield


async def test_c32_fencing_holds_when_the_advisory_lock_is_reentrant(harness):
    async with harness.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", "Shared session", OPENING)], "public")
    saga = store_credit_payout(notice_model())
    a, b = _ReentrantLockRunner(harness.pool, saga, **FAST), _ReentrantLockRunner(harness.pool, saga, **FAST)
    held: list[RowLock] = []
    seen: dict = {}

    async def busy_before_the_refund(position, name):
        if position == 3:
            held.append(await RowLock.acquire(harness.url, cid))

    async def b_aborts_while_a_backs_off(position, attempt, exc):
        if position == 4 and not seen:
            while held:
                await held.pop().release()
            run_id = await scalar(harness, "SELECT id FROM saga_runs WHERE run_key = 'payout-c32b'")
            seen["b"] = await b.abort(run_id, "a second runner got in")

    a.hooks.after_step.append(busy_before_the_refund)
    a.hooks.after_failure.append(b_aborts_while_a_backs_off)
    try:
        with pytest.raises(SagaFenced):
            await a.start("payout-c32b", payout_input(cid, AMOUNT, "SC-32b"))
    finally:
        while held:
            await held.pop().release()
    assert seen["b"].status == "compensated"
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 0
    assert (await payout_effects(harness, cid, OPENING))["credit_deducted_cents"] == 0
