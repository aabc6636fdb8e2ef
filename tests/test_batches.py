"""Hand-written batches (agentlab.lab.batches): ids, frames, customers and what the database holds for them."""

from __future__ import annotations

import json

from agentlab.core.safeguards import preset
from agentlab.lab.batches import (
    BATCH_COLUMNS,
    STEP_COLUMNS,
    batch_frame,
    customer_rows,
    new_customer,
    steps_frame,
    tool_calls,
)


def test_tool_calls_have_the_shape_of_ai_message_tool_calls_and_fixed_ids():
    calls = tool_calls(("ApplyCredit", {"customer_id": 1, "amount_cents": "42"}), ("LookupCustomer", {"customer_id": 1}),
                       prefix="nb")
    assert calls == [
        {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": "42"}, "id": "nb-1", "type": "tool_call"},
        {"name": "LookupCustomer", "args": {"customer_id": 1}, "id": "nb-2", "type": "tool_call"},
    ]


async def test_batch_frame_shows_each_call_in_order_with_what_the_model_reads(harness):
    customer = await new_customer(harness, 1000)
    calls = tool_calls(("ApplyCredit", {"customer_id": customer, "amount_cents": 400}),
                       ("ApplyCredit", {"customer_id": customer, "amount_cents": "x"}), prefix="f")
    batch = await harness.node(preset("full")).run_batch(calls, tenant_id="acme", thread_id="t-frame")
    frame = batch_frame(batch)
    assert list(frame.columns) == list(BATCH_COLUMNS)
    assert frame[["call", "outcome", "category"]].values.tolist() == [
        ["f-1", "not_applied", "not_applied"], ["f-2", "failed", "invalid_arguments"]]
    assert frame.message[1].startswith("FAILED [invalid_arguments]: argument 'amount_cents'")
    with_args = batch_frame(batch, calls)
    assert json.loads(with_args.args[1]) == {"customer_id": customer, "amount_cents": "x"}
    assert (await customer_rows(harness, [customer])).credit_cents.tolist() == [1000]


async def test_new_customer_writes_to_the_schema_asked_and_customer_rows_reads_it_back(harness):
    strict = await new_customer(harness, 700)
    lax = await new_customer(harness, 300, schema="lax")
    node = harness.node(preset("naive"))
    march = {"customer_id": lax, "billing_period": "2026-03-01", "amount_cents": 100}
    for turn in ("a", "b"):  # no UNIQUE key in lax: two rows
        await node.run_batch(tool_calls(("CreateInvoice", march), prefix=turn), tenant_id="acme", thread_id="t-rows")
    rows = await customer_rows(harness, [lax], schema="lax")
    assert rows.to_dict("records") == [{"customer_id": lax, "credit_cents": 300, "invoices": 2,
                                        "billing_periods": "2026-03-01, 2026-03-01", "credit_memos": 0, "refunds": 0}]
    assert (await customer_rows(harness, [lax, strict])).customer_id.tolist() == [strict]  # lax rows are not in public
    assert (await customer_rows(harness, [strict, 999_999])).credit_cents.tolist() == [700]


async def test_customer_rows_keep_the_order_given(harness):
    first, second = await new_customer(harness, 1), await new_customer(harness, 2)
    assert (await customer_rows(harness, [second, first])).credit_cents.tolist() == [2, 1]


async def test_steps_frame_lists_every_tool_call_of_an_episode_by_batch(harness):
    episode = await harness.run_episode("refund", "full")
    frame = steps_frame(episode.messages)
    assert list(frame.columns) == list(STEP_COLUMNS)
    assert frame.step.tolist() == [1, 1, 1, 2, 2, 2]
    assert frame.outcome.tolist() == ["not_applied", "not_applied", "failed", "applied", "applied", "applied"]
