"""Exercises of notebook 08 (the outbox and the payment provider)."""

from __future__ import annotations

import asyncio
import uuid

from agentlab import OutboxWorker, SimulatedCrash, charge_dedupe_key, new_customer, preset, tool_calls

OUTBOX_ROW = "SELECT status FROM outbox WHERE dedupe_key = %s"


async def late_recovery(h, days: float) -> dict:
    """Exercise 8.1: the worker dies after the provider call; ``days`` later the queue is drained again."""
    customer = await new_customer(h, 4000)
    march = {"customer_id": customer, "billing_period": "2026-03-01", "amount_cents": 12000}
    calls = tool_calls(("CreateInvoice", march), ("ApplyCredit", {"customer_id": customer, "amount_cents": 4000}),
                       ("QueueCharge", {**march, "amount_cents": 8000}), prefix="late")
    await h.node(preset("full")).run_batch(calls, tenant_id="acme", thread_id=f"ex08-late-{uuid.uuid4().hex[:12]}")

    def worker_dies(row_id):
        raise SimulatedCrash("the worker died after the provider answered")

    h.worker.hooks.after_provider_call.append(worker_dies)
    try:
        await h.worker.drain()
    except SimulatedCrash:
        pass
    finally:
        h.worker.hooks.after_provider_call.remove(worker_dies)
    h.provider.clock.advance(days * 86400)
    stats = await h.worker.drain()
    status = await h.df(OUTBOX_ROW, (charge_dedupe_key(customer, "2026-03-01"),))
    charges = [p for p in await h.provider.payments(customer) if p["kind"] == "charge"]
    return {"status": status.status[0], "reconciled": stats.reconciled, "charges_at_provider": len(charges)}


async def two_workers(h, months: int = 10) -> dict:
    """Exercise 8.2: ``months`` invoices and charges for one customer, drained by two workers at once."""
    customer = await new_customer(h, 0)
    calls = []
    for m in range(months):
        period = {"customer_id": customer, "billing_period": f"{2027 + m // 12}-{m % 12 + 1:02d}-01"}
        calls += [("CreateInvoice", {**period, "amount_cents": 1000 + m}), ("QueueCharge", {**period, "amount_cents": 1000 + m})]
    await h.node(preset("full")).run_batch(tool_calls(*calls, prefix="month"),
                                           tenant_id="acme", thread_id=f"ex08-workers-{uuid.uuid4().hex[:12]}")
    first = OutboxWorker(h.pool, h.provider, batch_size=3)
    second = OutboxWorker(h.pool, h.provider, batch_size=3)
    a, b = await asyncio.gather(first.drain(), second.drain())
    charges = [p for p in await h.provider.payments(customer) if p["kind"] == "charge"]
    return {
        "dispatched": a.dispatched + b.dispatched,
        "charges_at_provider": len(charges),
        "distinct_references": len({p["reference"] for p in charges}),
    }
