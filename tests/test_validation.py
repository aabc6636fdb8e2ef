"""Cases C03 and C04: strict argument models refuse LLM-shaped values before any SQL is sent.

"No SQL was sent" is read from the pool's own statistics: a batch that never borrowed a
connection cannot have sent a statement.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentlab.core.errors import find_leaks, translate
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from agentlab.domains.billing.tools import get_tool


def requests(h) -> int:
    return h.pool.get_stats().get("requests_num", 0)


VALID_CREDIT = {"customer_id": 1, "amount_cents": 42}

# (case, tool, args, accepted?, field the rejection must name)
C04_ROWS = [
    ("int", "ApplyCredit", {"customer_id": 1, "amount_cents": 42}, True, None),
    ("str_number", "ApplyCredit", {"customer_id": 1, "amount_cents": "42"}, False, "amount_cents"),
    ("str_exponent", "ApplyCredit", {"customer_id": 1, "amount_cents": "1e3"}, False, "amount_cents"),
    ("float_fraction", "ApplyCredit", {"customer_id": 1, "amount_cents": 3.5}, False, "amount_cents"),
    ("float_whole", "ApplyCredit", {"customer_id": 1, "amount_cents": 42.0}, False, "amount_cents"),
    ("bool", "ApplyCredit", {"customer_id": 1, "amount_cents": True}, False, "amount_cents"),
    ("null", "ApplyCredit", {"customer_id": 1, "amount_cents": None}, False, "amount_cents"),
    ("negative", "ApplyCredit", {"customer_id": 1, "amount_cents": -5}, False, "amount_cents"),
    ("stray_quote_id", "ApplyCredit", {"customer_id": "12'", "amount_cents": 42}, False, "customer_id"),
    ("str_id", "ApplyCredit", {"customer_id": "12", "amount_cents": 42}, False, "customer_id"),
    ("extra_key", "ApplyCredit", {"customer_id": 1, "amout_cents": 42}, False, "amout_cents"),
    ("us_date", "CreateInvoice", {"customer_id": 1, "billing_period": "03/01/2026", "amount_cents": 100}, False,
     "billing_period"),
    ("impossible_date", "CreateInvoice", {"customer_id": 1, "billing_period": "2026-02-30", "amount_cents": 100},
     False, "billing_period"),
    ("year_one", "CreateInvoice", {"customer_id": 1, "billing_period": "0001-01-01", "amount_cents": 100}, False,
     "billing_period"),
    ("year_9999", "CreateInvoice", {"customer_id": 1, "billing_period": "9999-12-01", "amount_cents": 100}, False,
     "billing_period"),
    ("iso_first_of_month", "CreateInvoice", {"customer_id": 1, "billing_period": "2026-03-01", "amount_cents": 100},
     True, None),
]


@pytest.mark.parametrize("case,tool,args,accepted,field", C04_ROWS, ids=[r[0] for r in C04_ROWS])
def test_c04_llm_shaped_values_have_decided_outcomes(case, tool, args, accepted, field):
    spec = get_tool(tool)
    if accepted:
        assert spec.validate(args)
        return
    with pytest.raises(ValidationError) as info:
        spec.validate(args)
    tr = translate(info.value, allowed_args=spec.arg_names)
    assert f"'{field}'" in tr.message, tr.message
    assert tr.message.startswith("FAILED [invalid_arguments]: ")
    assert find_leaks(tr.message) == []


async def test_c04_rejected_values_reach_no_database(harness):
    node = harness.node(preset("full").replace(policy="partial"))
    bad = [r for r in C04_ROWS if not r[3]]
    tool_calls = [{"name": t, "args": a, "id": f"call_{c}", "type": "tool_call"} for c, t, a, _, _ in bad]
    before = requests(harness)
    batch = await node.run_batch(tool_calls, thread_id="t-c04", tenant_id="acme")
    assert requests(harness) == before  # no connection was borrowed: no SQL was sent
    assert [r.outcome for r in batch.results] == [Outcome.FAILED] * len(bad)
    for (case, _, _, _, field), r in zip(bad, batch.results):
        assert f"'{field}'" in r.content, (case, r.content)


async def test_c04_the_missing_field_is_named_next_to_the_unknown_key():
    spec = get_tool("ApplyCredit")
    with pytest.raises(ValidationError) as info:
        spec.validate({"customer_id": 1, "amout_cents": 42})
    message = translate(info.value, allowed_args=spec.arg_names).message
    assert "'amout_cents' is not an argument of this tool (allowed: customer_id, amount_cents)" in message
    assert "argument 'amount_cents' is required" in message


async def test_c03_swapped_window_fails_with_a_fix_and_sends_no_sql(harness):
    node = harness.node(preset("full"))
    before = requests(harness)
    batch = await node.run_batch([{
        "name": "ListRefunds", "id": "call_window", "type": "tool_call",
        "args": {"customer_id": 1, "from_date": "2026-03-31", "to_date": "2026-03-01"},
    }], thread_id="t-c03", tenant_id="acme")
    assert requests(harness) == before
    (result,) = batch.results
    assert result.outcome is Outcome.FAILED
    assert result.content.startswith("FAILED [invalid_arguments]: ")
    assert "from_date must be on or before to_date" in result.content and "swap" in result.content
    assert find_leaks(result.content) == []


async def test_c03_the_valid_window_runs(harness):
    node = harness.node(preset("full"))
    batch = await node.run_batch([{
        "name": "ListRefunds", "id": "call_window_ok", "type": "tool_call",
        "args": {"customer_id": 1, "from_date": "2026-03-01", "to_date": "2026-03-31"},
    }], thread_id="t-c03b", tenant_id="acme")
    assert batch.results[0].outcome is Outcome.APPLIED
    assert batch.results[0].result == {"refunds": []}
