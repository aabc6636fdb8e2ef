"""The billing tools as a LangChain user writes them: ``@tool`` functions, default schemas, autocommit.

This is the first draft the documentation leads to (LangChain "Tools": "the simplest way to create a
tool is with the ``@tool`` decorator"; the function's signature is the schema, its docstring the
description): each tool borrows a connection from an autocommit pool, runs its statement, and returns
a dict; the refund and the charge call the payment provider inline, as a tool calls any API. Nothing
here is hardened on purpose: no transaction around a batch, no idempotency key, no outbox, the
schemas coerce what they can (``"12"`` becomes ``12``), an exception leaves the tool as it was raised.

The SQL is the kit's own (:mod:`agentlab.domains.billing.tools`), on the same schema and seed, so the
yardstick compares agents, not queries. :data:`BASELINE_TOOL_NAMES` maps the domain's tool names (what the
scripted model plays) to these functions' names. The last two are billing's check-then-act tools
(:mod:`agentlab.domains.billing.limits`) as a first draft writes them: read the balance (or the day's
refunds), check, write, each statement committed on its own.
"""

from __future__ import annotations

from langchain_core.tools import tool

from agentlab.domains.billing.limits import (
    DAILY_REFUND_CAP_CENTS,
    READ_CREDIT,
    RECORD_REDEMPTION,
    REFUNDED_TODAY,
    WRITE_CREDIT,
)
from agentlab.domains.billing.tools import (
    APPLY_CREDIT,
    CREATE_CREDIT_MEMO,
    CREATE_CREDIT_MEMO_FOR_INVOICE,
    CREATE_INVOICE,
    CREATE_REFUND,
    FIND_INVOICE,
    LOOKUP_CUSTOMER,
)

BASELINE_TOOL_NAMES: dict[str, str] = {
    "LookupCustomer": "lookup_customer", "ApplyCredit": "apply_credit", "CreateInvoice": "create_invoice",
    "QueueCharge": "charge_invoice", "CreateCreditMemo": "create_credit_memo", "QueueRefund": "refund_to_card",
    "RedeemCredit": "redeem_credit", "RefundWithinCap": "refund_within_cap",
}


def billing_tools(pool, provider) -> list:
    """The ``@tool`` functions on ``pool`` (a psycopg ``AsyncConnectionPool`` with ``autocommit=True``)
    and ``provider`` (:class:`agentlab.sim.provider.FakePaymentProvider`), in the order of :data:`BASELINE_TOOL_NAMES`."""

    @tool
    async def lookup_customer(customer_id: int) -> dict:
        """Read a customer's name, available credit (in cents) and number of open invoices."""
        async with pool.connection() as conn:
            row = await (await conn.execute(LOOKUP_CUSTOMER, (customer_id,))).fetchone()
        return {"customer_id": row[0], "name": row[1], "available_credit_cents": row[2], "open_invoices": row[3]}

    @tool
    async def apply_credit(customer_id: int, amount_cents: int) -> dict:
        """Deduct amount_cents from the customer's available credit balance."""
        async with pool.connection() as conn:
            row = await (await conn.execute(APPLY_CREDIT, (amount_cents, customer_id))).fetchone()
        return {"customer_id": customer_id, "applied_cents": amount_cents, "remaining_credit_cents": row[0]}

    @tool
    async def create_invoice(customer_id: int, billing_period: str, amount_cents: int) -> dict:
        """Create the customer's invoice for one billing period (first day of the month, YYYY-MM-01)."""
        async with pool.connection() as conn:
            row = await (await conn.execute(CREATE_INVOICE, (billing_period, amount_cents, customer_id))).fetchone()
        return {"invoice_id": row[0], "customer_id": customer_id, "billing_period": billing_period,
                "amount_cents": amount_cents}

    @tool
    async def charge_invoice(customer_id: int, billing_period: str, amount_cents: int) -> dict:
        """Charge the customer's card for an existing invoice."""
        async with pool.connection() as conn:
            invoice = await (await conn.execute(FIND_INVOICE, (customer_id, billing_period))).fetchone()
        if invoice is None:
            return {"error": "no invoice for that billing period; create the invoice first"}
        charge = await provider.create_charge(customer_id, amount_cents, reference=f"invoice-{invoice[0]}")
        return {"invoice_id": invoice[0], "amount_cents": amount_cents, "payment_id": charge["id"]}

    @tool
    async def create_credit_memo(customer_id: int, reference: str, amount_cents: int, reason: str = "",
                                 invoice_id: int | None = None) -> dict:
        """Record a credit memo for a customer under a business reference."""
        async with pool.connection() as conn:
            if invoice_id is None:
                cur = await conn.execute(CREATE_CREDIT_MEMO, (reference, amount_cents, reason, customer_id))
            else:
                cur = await conn.execute(CREATE_CREDIT_MEMO_FOR_INVOICE,
                                         (reference, amount_cents, reason, invoice_id, customer_id))
            row = await cur.fetchone()
        return {"credit_memo_id": row[0], "reference": reference, "amount_cents": amount_cents}

    @tool
    async def refund_to_card(customer_id: int, reference: str, amount_cents: int) -> dict:
        """Refund money to the customer's card under a business reference."""
        async with pool.connection() as conn:
            row = await (await conn.execute(CREATE_REFUND, (reference, amount_cents, customer_id))).fetchone()
        refund = await provider.create_refund(customer_id, amount_cents, reference=reference)
        return {"refund_id": row[0], "amount_cents": amount_cents, "payment_id": refund["id"]}

    @tool
    async def redeem_credit(customer_id: int, amount_cents: int) -> dict:
        """Redeem amount_cents of the customer's store credit; refused when the credit does not cover it."""
        async with pool.connection() as conn:
            tenant_id, balance = await (await conn.execute(READ_CREDIT, (customer_id,))).fetchone()
            if amount_cents > balance:
                return {"error": f"the customer's credit is {balance} cents; redeem at most that"}
            await conn.execute(WRITE_CREDIT, (balance - amount_cents, customer_id))
            await conn.execute(RECORD_REDEMPTION, (tenant_id, customer_id, amount_cents, balance - amount_cents))
        return {"customer_id": customer_id, "redeemed_cents": amount_cents, "remaining_credit_cents": balance - amount_cents}

    @tool
    async def refund_within_cap(customer_id: int, reference: str, amount_cents: int) -> dict:
        """Refund money to the customer's card under a business reference, within the daily refund cap per
        customer (5000 cents a day); refused when the day's refunds would exceed the cap."""
        async with pool.connection() as conn:
            (refunded,) = await (await conn.execute(REFUNDED_TODAY, (customer_id,))).fetchone()
            if refunded + amount_cents > DAILY_REFUND_CAP_CENTS:
                return {"error": f"{refunded} cents were refunded today; the cap is {DAILY_REFUND_CAP_CENTS} a day"}
            row = await (await conn.execute(CREATE_REFUND, (reference, amount_cents, customer_id))).fetchone()
        refund = await provider.create_refund(customer_id, amount_cents, reference=reference)
        return {"refund_id": row[0], "amount_cents": amount_cents, "payment_id": refund["id"]}

    return [lookup_customer, apply_credit, create_invoice, charge_invoice, create_credit_memo, refund_to_card,
            redeem_credit, refund_within_cap]
