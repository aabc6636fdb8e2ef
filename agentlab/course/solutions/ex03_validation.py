"""Exercises of notebook 03 (tools and strict validation)."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import sql
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from agentlab import Cents, CustomerId, new_customer, preset, tool_calls, translate

COUNT_MARCH_INVOICES = """
SELECT count(*) AS n FROM {}.invoices
WHERE customer_id = %s AND billing_period >= '2026-03-01' AND billing_period < '2026-04-01'
"""


async def march_invoices(h, preset_name: str) -> dict:
    """Exercise 3.1: ``CreateInvoice`` for 2026-03-15, then for 2026-03-01, for one new customer.

    Returns the two calls' ``outcomes`` and ``march_invoices``, the March 2026 invoices the database
    holds for the customer.
    """
    sg = preset(preset_name)
    customer = await new_customer(h, 0, schema=sg.schema)
    node = h.node(sg)
    thread = f"ex03-march-{uuid.uuid4().hex[:12]}"
    outcomes = []
    for turn, period in (("turn1", "2026-03-15"), ("turn2", "2026-03-01")):
        args = {"customer_id": customer, "billing_period": period, "amount_cents": 12000}
        batch = await node.run_batch(tool_calls(("CreateInvoice", args), prefix=turn), tenant_id="acme", thread_id=thread)
        outcomes.append(batch.results[0].outcome.value)
    count = await h.df(sql.SQL(COUNT_MARCH_INVOICES).format(sql.Identifier(sg.schema)), (customer,))
    return {"outcomes": outcomes, "march_invoices": int(count.n[0])}


class TransferCredit(BaseModel):
    """Move amount_cents of store credit from one customer to another (two different customers)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    from_customer_id: CustomerId
    to_customer_id: CustomerId
    amount_cents: Cents

    @model_validator(mode="after")
    def _two_customers(self) -> TransferCredit:
        if self.from_customer_id == self.to_customer_id:
            raise ValueError("to_customer_id must differ from from_customer_id; name the receiving customer")
        return self


def transfer_outcomes(cases: list[dict[str, Any]]) -> list[str]:
    """Exercise 3.2: ``"accepted"`` or the model-facing refusal for each argument dict."""
    out = []
    for args in cases:
        try:
            TransferCredit.model_validate(args)
        except ValidationError as exc:
            out.append(translate(exc, allowed_args=tuple(TransferCredit.model_fields)).message)
        else:
            out.append("accepted")
    return out
