"""Exercises of notebook 05 (the transactional node)."""

from __future__ import annotations

import uuid

from agentlab import customer_rows, new_customer, preset, tool_calls

COMMIT_ROLLED_BACK = "SELECT count(*) AS n FROM events WHERE thread_id = %s AND outcome = 'commit_rolled_back'"
APRIL_INVOICES = "SELECT count(*) AS n FROM invoices WHERE customer_id = %s AND billing_period = '2026-04-01'"


async def invoice_story(h, preset_name: str) -> dict:
    """Exercise 5.1: the invoice story under ``preset_name``, read back from the database and the provider."""
    episode = await h.run_episode("invoice", preset_name)
    state = (await h.end_state(episode))["customers"][0]
    await h.events.flush()
    rolled_back = await h.df(COMMIT_ROLLED_BACK, (episode.thread_id,))
    return {
        "invoices": state["invoices"],
        "final_credit_cents": state["final_credit_cents"],
        "provider_charges": state["provider_charges"],
        "commit_rolled_back_events": int(rolled_back.n[0]),
    }


async def dependent_batch(h, policy: str) -> dict:
    """Exercise 5.2: an invalid invoice, a charge that needs it, an independent memo, under ``policy``."""
    customer = await new_customer(h, 0)
    april = {"customer_id": customer, "billing_period": "2026-04-01"}
    calls = tool_calls(
        ("CreateInvoice", {**april, "amount_cents": 0}),
        ("QueueCharge", {**april, "amount_cents": 9000}),
        ("CreateCreditMemo", {"customer_id": customer, "reference": "GOODWILL-4", "amount_cents": 500}),
        prefix="dep",
    )
    batch = await h.node(preset("full").replace(policy=policy)).run_batch(
        calls, tenant_id="acme", thread_id=f"ex05-dependent-{uuid.uuid4().hex[:12]}")
    held = (await customer_rows(h, [customer])).iloc[0]
    invoices = await h.df(APRIL_INVOICES, (customer,))
    return {
        "outcomes": [r.outcome.value for r in batch.results],
        "invoices": int(invoices.n[0]),
        "credit_memos": int(held["credit_memos"]),
    }
