"""C37: a correction delivered before the notice it corrects.

The payout saga's notice e-mail fails once on a mail-relay timeout and backs off; meanwhile step 4
fails permanently, the saga is compensated and its correction is queued, due at once. The customer
must get the notice first and the correction last: the notifier's own records show the order.
"""

from __future__ import annotations

from agentlab.core.outbox import OutboxWorker
from agentlab.demos.payout_saga import INSERT_EARLIER_REFUND, notice_model, payout_input, store_credit_payout
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.saga import Backoff, SagaRunner
from agentlab.sim.notifier import MailRelayTimeout
from conftest import fetch

FAST = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=2, initial_s=0.01),
        "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}
BACKOFF_S = 0.5  # the relay's back-off: long enough for the correction to be due well before the notice


async def test_c37_the_correction_reaches_the_customer_after_the_notice_it_corrects(harness):
    async with harness.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", "Ordered", 5000)], "public")
        await conn.execute(INSERT_EARLIER_REFUND, ("SC-37", 2000, cid))  # step 4 will fail permanently
    worker = OutboxWorker(harness.pool, harness.provider, notifier=harness.notifier, backoff_s=BACKOFF_S)
    runner = SagaRunner(harness.pool, store_credit_payout(notice_model()), **FAST)
    first_try: list = []

    async def send_the_notice_now(position, name):
        if position == 3:  # the worker picks the notice up at once; the relay times out
            harness.notifier.fail_next()
            first_try.append(await worker.run_once())

    runner.hooks.after_step.append(send_the_notice_now)
    rep = await runner.start("payout-c37", payout_input(cid, 2000, "SC-37"))
    assert rep.status == "compensated" and rep.compensations == [3, 2, 1]
    assert (first_try[0].claimed, first_try[0].retried) == (1, 1)
    thread = f"saga:{rep.run_id}"
    # the correction is due now, the notice only after its back-off
    due = await fetch(harness, "SELECT payload->>'corrects' IS NULL, attempts, available_at <= now() FROM outbox "
                               "WHERE thread_id = %s ORDER BY id", (thread,))
    assert due == [(True, 1, False), (False, 0, True)]

    stats = await worker.drain(timeout_s=10)
    assert stats.dispatched == 2 and stats.dead_lettered == 0
    sent = await harness.notifier.messages(f"customer-{cid}@example.com")
    assert [m["corrects"] is None for m in sent] == [True, False]  # the notice, then its correction
    assert sent[1]["corrects"] == sent[0]["reference"] and sent[0]["created_at"] <= sent[1]["created_at"]
    assert await fetch(harness, "SELECT status, attempts FROM outbox WHERE thread_id = %s ORDER BY id", (thread,)) == [
        ("dispatched", 2), ("dispatched", 1)]


async def test_c37_messages_of_other_threads_are_not_held_up(harness):
    """Only a thread's own earlier message holds a message back: another run's correction goes out."""
    import json

    from agentlab.core.outbox import INSERT_OUTBOX, NOTIFY_TOPIC

    async with harness.pool.connection() as conn:
        for key, thread in (("a-notice", "saga:1"), ("b-notice", "saga:2")):
            await conn.execute(INSERT_OUTBOX, (NOTIFY_TOPIC, json.dumps(
                {"to": f"{thread}@example.com", "subject": key, "body": key}), key, thread))
    harness.notifier.fail_next(reference="a-notice")
    worker = OutboxWorker(harness.pool, harness.provider, notifier=harness.notifier, backoff_s=5)
    first = await worker.run_once()
    assert (first.claimed, first.dispatched, first.retried) == (2, 1, 1)
    assert [m["reference"] for m in await harness.notifier.messages()] == ["b-notice"]
    assert MailRelayTimeout.__mro__[1] is TimeoutError
