"""C36: a credit memo names another customer's invoice (same tenant).

Customers 1 and 2 are both tenant ``acme`` (seed data); customer 2 has an invoice. A memo for
customer 1 naming that invoice is refused by the database (a composite foreign key on customer and
invoice), with the same ``FAILED [not_found]`` answer as an invoice that does not exist; nothing
is stored. The tool path and a direct INSERT are both refused.
"""

from __future__ import annotations

import psycopg
import pytest

from agentlab.core.errors import Category, translate
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from conftest import fetch, scalar

TENANT = "acme"
MISSING_ID = 987_654
INVOICE_OF_2 = ("INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                "VALUES ('acme', 2, '2026-03-01', 1000) RETURNING id")
INVOICE_OF_1 = ("INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                "VALUES ('acme', 1, '2026-03-01', 1000) RETURNING id")


def memo_call(invoice_id: int, reference: str) -> list[dict]:
    args = {"customer_id": 1, "reference": reference, "amount_cents": 100, "invoice_id": invoice_id}
    return [{"name": "CreateCreditMemo", "args": args, "id": f"call-{reference}", "type": "tool_call"}]


@pytest.mark.parametrize("safeguards", ["full", "ledger"])
async def test_c36_credit_memo_for_another_customers_invoice_is_refused_by_the_database(harness, safeguards):
    invoice_of_2 = await scalar(harness, INVOICE_OF_2)
    node = harness.node(preset(safeguards))
    other = await node.run_batch(memo_call(invoice_of_2, "M-1"), thread_id="t-c36-1", tenant_id=TENANT)
    missing = await node.run_batch(memo_call(MISSING_ID, "M-2"), thread_id="t-c36-2", tenant_id=TENANT)

    result = other.results[0]
    assert result.outcome is Outcome.FAILED and result.category == Category.NOT_FOUND.value
    # refused by the row policy under isolation (full), else by the composite foreign key
    assert result.translation.sqlstate == ("42501" if safeguards == "full" else "23503")
    assert missing.results[0].translation.sqlstate == result.translation.sqlstate
    if safeguards == "full":  # sanitized: the same words as for an invoice that does not exist
        assert result.content.startswith("FAILED [not_found]") and result.content == missing.results[0].content
    assert await scalar(harness, "SELECT count(*) FROM credit_memos") == 0
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0  # a failed call leaves no ledger row

    own = await scalar(harness, INVOICE_OF_1)  # the customer's own invoice is accepted
    ok = await node.run_batch(memo_call(own, "M-3"), thread_id="t-c36-3", tenant_id=TENANT)
    assert ok.results[0].outcome is Outcome.APPLIED
    assert await fetch(harness, "SELECT customer_id, invoice_id FROM credit_memos") == [(1, own)]


async def test_c36_a_direct_insert_naming_another_customers_invoice_is_refused(harness):
    invoice_of_2 = await scalar(harness, INVOICE_OF_2)
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
        async with harness.pool.connection() as conn:
            await conn.execute("INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents, invoice_id) "
                               "VALUES ('acme', 1, 'M-9', 100, %s)", (invoice_of_2,))
    assert refused.value.diag.constraint_name == "credit_memos_invoice_customer_fk"
    assert translate(refused.value).category is Category.NOT_FOUND
    assert await scalar(harness, "SELECT count(*) FROM credit_memos") == 0
