"""C20: a poison row in the outbox blocks no other row, and loses no other row's mark."""

from __future__ import annotations

import json

import pytest

from agentlab.core.errors import SimulatedCrash
from agentlab.core.outbox import REFUND_TOPIC
from conftest import fetch, scalar

ROWS = 60
POISON = 4  # the fourth row's payload has no amount_cents


async def queue_refunds(h) -> None:
    async with h.pool.connection() as conn:
        for n in range(1, ROWS + 1):
            payload = {"customer_id": 3} if n == POISON else {"customer_id": 3, "amount_cents": 100 + n}
            await conn.execute("INSERT INTO outbox (topic, payload, dedupe_key) VALUES (%s, %s, %s)",
                               (REFUND_TOPIC, json.dumps(payload), f"refund:3:rma-{n}"))


async def test_c20_a_row_without_amount_is_parked_and_the_other_59_are_paid_once(harness):
    await queue_refunds(harness)
    first = await harness.worker.drain()
    second = await harness.worker.drain()  # nothing is left to do, and nothing raises
    assert (first.dispatched, first.dead_lettered, first.retried) == (ROWS - 1, 1, 0)
    assert (second.claimed, second.dispatched) == (0, 0)
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE kind = 'refund'") == ROWS - 1
    assert await scalar(harness, "SELECT count(DISTINCT reference) FROM provider.payments") == ROWS - 1
    statuses = dict(await fetch(harness, "SELECT status, count(*) FROM outbox GROUP BY status"))
    assert statuses == {"dispatched": ROWS - 1, "dead_letter": 1}
    key, error = (await fetch(harness, "SELECT dedupe_key, last_error FROM outbox WHERE status = 'dead_letter'"))[0]
    assert key == f"refund:3:rma-{POISON}"
    assert error == "parked for a human: payload has no amount_cents"
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE reference = %s", (key,)) == 0


@pytest.mark.parametrize("payload", [[1, 2], {"customer_id": "3", "amount_cents": 100},
                                     {"customer_id": 3, "amount_cents": None}, {"customer_id": 3, "amount_cents": True}])
async def test_c20_every_unreadable_payload_is_parked_not_raised(harness, payload):
    async with harness.pool.connection() as conn:
        await conn.execute("INSERT INTO outbox (topic, payload, dedupe_key) VALUES (%s, %s, 'bad'), (%s, %s, 'good')",
                           (REFUND_TOPIC, json.dumps(payload), REFUND_TOPIC,
                            json.dumps({"customer_id": 3, "amount_cents": 700})))
    stats = await harness.worker.drain()
    assert (stats.dispatched, stats.dead_lettered) == (1, 1)
    assert await fetch(harness, "SELECT dedupe_key, status FROM outbox ORDER BY id") == [
        ("bad", "dead_letter"), ("good", "dispatched")]
    assert await fetch(harness, "SELECT reference, amount_cents FROM provider.payments") == [("good", 700)]


async def test_c20_an_unexpected_error_in_one_dispatch_retries_that_row_alone(harness):
    await queue_refunds(harness)
    real = harness.provider.create_refund
    broke = []

    async def flaky(customer_id, amount_cents, **kw):  # a bug on one row's first attempt, not a provider error
        if kw.get("reference") == "refund:3:rma-10" and not broke:
            broke.append(1)
            raise ZeroDivisionError("a bug in the dispatcher")
        return await real(customer_id, amount_cents, **kw)

    harness.provider.create_refund = flaky
    stats = await harness.worker.drain()
    assert (stats.dispatched, stats.retried, stats.dead_lettered) == (ROWS - 1, 1, 1)
    assert await scalar(harness, "SELECT attempts FROM outbox WHERE dedupe_key = 'refund:3:rma-10'") == 2
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == ROWS - 1


async def test_c20_marks_of_rows_already_paid_survive_a_crash_on_a_later_row(harness):
    await queue_refunds(harness)
    calls = []

    def die_on_the_third(row_id):
        calls.append(row_id)
        if len(calls) == 3:
            raise SimulatedCrash("the worker died after the provider call of its third row")

    harness.worker.hooks.after_provider_call.append(die_on_the_third)
    with pytest.raises(SimulatedCrash):
        await harness.worker.drain()
    harness.worker.hooks.after_provider_call.remove(die_on_the_third)
    # the two rows paid before the crash stay marked; the third was paid and is pending (found by reference later)
    assert await fetch(harness, "SELECT dedupe_key FROM outbox WHERE status = 'dispatched' ORDER BY id") == [
        ("refund:3:rma-1",), ("refund:3:rma-2",)]
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 3
    stats = await harness.worker.drain()
    assert stats.reconciled == 1 and stats.dispatched == ROWS - 3 and stats.dead_lettered == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == ROWS - 1
