"""C40: a helper that creates data puts it where the preset's tools look, or refuses naming the schema."""

from __future__ import annotations

import pytest

from agentlab.core.safeguards import PRESETS, preset
from agentlab.lab.batches import customer_rows, new_customer, tool_calls
from conftest import fetch


async def credit(h, schema: str, customer: int) -> list[tuple]:
    return await fetch(h, f"SELECT credit_cents FROM {schema}.customers WHERE id = %s", (customer,))


async def apply_credit(h, sg_name: str, customer: int, thread: str):
    calls = tool_calls(("ApplyCredit", {"customer_id": customer, "amount_cents": 1000}), prefix=thread)
    return await h.node(preset(sg_name)).run_batch(calls, tenant_id="acme", thread_id=thread)


async def test_c40_new_customer_then_a_naive_batch_finds_the_customer(harness):
    customer = await new_customer(harness, 5000)  # the case's input: no preset named
    batch = await apply_credit(harness, "naive", customer, "c40-naive")
    assert [r.outcome.value for r in batch.results] == ["applied"], batch.results[0].content
    assert await credit(harness, "lax", customer) == [(4000,)]  # naive works on lax ...
    assert await credit(harness, "public", customer) == [(5000,)]  # ... and leaves the public copy alone
    rows = await customer_rows(harness, [customer], preset="naive")
    assert rows["credit_cents"].tolist() == [4000]


@pytest.mark.parametrize("sg_name", list(PRESETS))
async def test_c40_new_customer_with_a_preset_writes_only_where_its_tools_look(harness, sg_name):
    sg = preset(sg_name)
    customer = await new_customer(harness, 5000, preset=sg_name)
    other = "public" if sg.schema == "lax" else "lax"
    assert await credit(harness, sg.schema, customer) == [(5000,)]
    assert await credit(harness, other, customer) == []
    batch = await apply_credit(harness, sg_name, customer, f"c40-{sg_name}")
    assert [r.outcome.value for r in batch.results] == ["applied"], batch.results[0].content
    assert (await customer_rows(harness, [customer], preset=sg))["credit_cents"].tolist() == [4000]


async def test_c40_a_schema_the_preset_does_not_use_is_refused_naming_both(harness):
    with pytest.raises(ValueError, match="preset 'naive' works on the schema 'lax'; schema='public' would put"):
        await new_customer(harness, 5000, preset="naive", schema="public")
    with pytest.raises(ValueError, match="schema must be 'public' or 'lax', not 'provider'"):
        await new_customer(harness, 5000, schema="provider")
    assert await fetch(harness, "SELECT count(*) FROM public.customers WHERE name = 'Workshop customer'") == [(0,)]
    assert await fetch(harness, "SELECT count(*) FROM lax.customers WHERE name = 'Workshop customer'") == [(0,)]


async def test_c40_an_explicit_schema_still_writes_there_only(harness):
    customer = await new_customer(harness, 1000, schema="lax")
    assert await credit(harness, "lax", customer) == [(1000,)] and await credit(harness, "public", customer) == []
