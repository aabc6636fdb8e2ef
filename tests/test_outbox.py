"""The outbox worker and the fake provider: exactly one payment per intent (case C08)."""

from __future__ import annotations

import json

import pytest

from agentlab.core.errors import IdempotencyConflict, SimulatedCrash
from agentlab.core.outbox import CHARGE_TOPIC
from conftest import fetch, scalar


async def queue(h, key: str, customer_id: int = 3, amount_cents: int = 9000) -> None:
    async with h.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox (topic, payload, dedupe_key) VALUES (%s, %s, %s)",
            (CHARGE_TOPIC, json.dumps({"customer_id": customer_id, "amount_cents": amount_cents}), key),
        )


async def test_c08_provider_times_out_after_charging_and_the_retry_charges_nothing_more(harness):
    await queue(harness, "charge:3:2026-05-01")
    harness.provider.fail_next("timeout_after_success")
    stats = await harness.worker.drain()
    assert stats.retried == 1 and stats.dispatched == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = 'cus_3'") == 1
    # the only idempotency key is the outbox row's dedupe key; the request body was the same
    keys = await fetch(harness, "SELECT key FROM provider.idempotency_keys")
    assert keys == [("charge:3:2026-05-01",)]
    # the retry first asked the provider for a payment with this reference, found it, and sent nothing
    assert stats.reconciled == 1
    assert [k for k, _ in harness.provider.request_log] == ["charge:3:2026-05-01"]
    status, attempts, ref = (await fetch(harness, "SELECT status, attempts, provider_ref FROM outbox"))[0]
    assert status == "dispatched" and attempts == 2 and ref.startswith("ch_")


async def test_c08_every_retry_sends_the_same_key_and_the_same_body(harness):
    await queue(harness, "charge:3:2026-08-01")
    harness.provider.fail_next("unavailable", times=2)  # refused before doing any work, twice
    stats = await harness.worker.drain()
    assert stats.retried == 2 and stats.dispatched == 1
    log = harness.provider.request_log
    assert len(log) == 3 and len(set(log)) == 1 and log[0][0] == "charge:3:2026-08-01"
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 1


async def test_c08_same_key_other_parameters_parks_the_row_and_mints_no_key(harness):
    await harness.provider.create_charge(3, 1000, idempotency_key="charge:3:2026-06-01", reference="charge:3:2026-06-01")
    await queue(harness, "charge:3:2026-06-01", amount_cents=2000)
    stats = await harness.worker.drain()
    assert stats.dead_lettered == 1 and stats.dispatched == 0
    assert await fetch(harness, "SELECT status FROM outbox") == [("dead_letter",)]
    assert "parked for a human" in await scalar(harness, "SELECT last_error FROM outbox")
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 1
    assert await fetch(harness, "SELECT key FROM provider.idempotency_keys") == [("charge:3:2026-06-01",)]


async def test_provider_refuses_a_reused_key_with_other_parameters(harness):
    first = await harness.provider.create_charge(4, 500, idempotency_key="k1")
    again = await harness.provider.create_charge(4, 500, idempotency_key="k1")
    assert again["id"] == first["id"] and again["replayed"] and not first["replayed"]
    with pytest.raises(IdempotencyConflict):
        await harness.provider.create_charge(4, 501, idempotency_key="k1")
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 1


async def test_provider_forgets_keys_after_its_retention(harness):
    await harness.provider.create_charge(4, 500, idempotency_key="k2")
    harness.provider.clock.advance(25 * 3600)
    await harness.provider.create_charge(4, 500, idempotency_key="k2")
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 2  # what the worker must guard


async def test_worker_crash_after_the_provider_call_then_a_forgotten_key_still_pays_once(harness):
    await queue(harness, "charge:3:2026-07-01")
    crashed = []

    def crash_once(row_id):
        if not crashed:
            crashed.append(row_id)
            raise SimulatedCrash("worker died after the provider answered")

    harness.worker.hooks.after_provider_call.append(crash_once)
    with pytest.raises(SimulatedCrash):
        await harness.worker.drain()
    assert await fetch(harness, "SELECT status, attempts FROM outbox") == [("pending", 0)]
    harness.provider.clock.advance(3 * 86400)  # days later: the provider no longer knows the key
    stats = await harness.worker.drain()
    assert stats.dispatched == 1 and stats.reconciled == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = 'cus_3'") == 1


async def test_skip_locked_lets_two_workers_share_rows_without_doubles(harness):
    import asyncio

    from agentlab.core.outbox import OutboxWorker

    for n in range(10):
        await queue(harness, f"charge:3:2027-{n + 1:02d}-01", amount_cents=100 + n)
    w2 = OutboxWorker(harness.pool, harness.provider, batch_size=3)
    harness.worker.batch_size = 3
    a, b = await asyncio.gather(harness.worker.drain(), w2.drain())
    assert a.dispatched + b.dispatched == 10
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 10
    assert await scalar(harness, "SELECT count(DISTINCT reference) FROM provider.payments") == 10
