"""The tools an agent calls: strict argument models, handlers on the caller's connection, a registry.

Argument models (pydantic, ``strict=True``, ``extra="forbid"``) are also the tools' LangChain
schemas: each class is named after its tool and its docstring is the tool's description, so
``model.bind_tools(tool_schemas())`` works as is.

Decided rules for LLM-shaped values (case C04; tests/test_validation.py checks every row):

=====================================  ==========================================================
value sent for a money or id field     outcome
=====================================  ==========================================================
``42`` (JSON integer)                  accepted
``"42"`` (a number as text)            rejected: a string is never silently a number or an id
``"1e3"``, ``3.5``, ``42.0``           rejected: money is a whole number of cents, sent as an integer
``true`` / ``false``                   rejected: a boolean is never an amount
``null``, missing                      rejected: the field is required
``-5``, ``0``                          rejected: amounts and ids are positive
``"12'"``                              rejected: not an integer
an unknown key (``amout_cents``)       rejected (``extra="forbid"``), and the missing field named
=====================================  ==========================================================

``billing_period`` is the first day of the billing month as ISO text, ``"2026-03-01"``;
``"03/01/2026"`` (ambiguous) and ``"2026-02-30"`` (no such day) are rejected.

Handlers take the caller's connection and never commit: the node owns the transaction. They use
unqualified table names, so the node's ``search_path`` picks the strict or the lax schema. The
tenant of a written row is taken from the customer row in the database, never from the model. Under
tenant isolation (:mod:`agentlab.lab.tenancy`) another tenant's customer is invisible to that SQL, so a
call naming it gets the same "no customer has this id" as an id that does not exist.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from agentlab.core.errors import Category, NotFound, ToolError
from agentlab.core.outbox import CHARGE_TOPIC, MAX_PAYMENT_CENTS, REFUND_TOPIC, send_payment
from agentlab.core.toolspec import StrictArgs, Toolset, ToolSpec, tool

if TYPE_CHECKING:
    from psycopg import AsyncConnection

MAX_AMOUNT_CENTS = 1_000_000_000  # ten million in the currency's major unit
MAX_ID = 2**63 - 1  # PostgreSQL bigint


def _iso_date(value: Any) -> date:
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or len(value) != 10 or value[4] != "-" or value[7] != "-":
        raise ValueError("must be a date as text in the form YYYY-MM-DD, for example 2026-03-01")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError("is not a real calendar date; use the form YYYY-MM-DD") from None


FIRST_BILLING_PERIOD = date(2000, 1, 1)
LAST_BILLING_PERIOD = date(2099, 12, 1)


def _first_of_month(value: Any) -> date:
    d = _iso_date(value)
    if d.day != 1:
        raise ValueError("must be the first day of the billing month, for example 2026-03-01")
    if not FIRST_BILLING_PERIOD <= d <= LAST_BILLING_PERIOD:
        raise ValueError(f"must be a billing month between {FIRST_BILLING_PERIOD} and {LAST_BILLING_PERIOD}")
    return d


Cents = Annotated[int, Field(strict=True, gt=0, le=MAX_AMOUNT_CENTS, description="amount in cents, a JSON integer")]
PaymentCents = Annotated[int, Field(strict=True, gt=0, le=MAX_PAYMENT_CENTS,
                                    description="amount in cents, a JSON integer, at most the payment provider's maximum")]
"""An amount sent to the payment provider: refused here, before anything is applied, when the provider would
refuse it (over :data:`agentlab.core.outbox.MAX_PAYMENT_CENTS`) after the batch committed."""
CustomerId = Annotated[int, Field(strict=True, gt=0, le=MAX_ID, description="the customer's numeric id")]
Reference = Annotated[
    str,
    Field(
        strict=True, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$",
        description="the business reference, e.g. an RMA or order number: letters, digits, . _ : -",
    ),
]
BillingPeriod = Annotated[
    date, BeforeValidator(_first_of_month), Field(description="first day of the billing month, YYYY-MM-01")
]
IsoDate = Annotated[date, BeforeValidator(_iso_date), Field(description="a date, YYYY-MM-DD")]


_Args = StrictArgs


class LookupCustomer(_Args):
    """Read a customer's name, available credit (in cents) and number of open invoices. Read only."""

    customer_id: CustomerId


class ApplyCredit(_Args):
    """Deduct amount_cents from the customer's available credit balance."""

    customer_id: CustomerId
    amount_cents: Cents


class CreateInvoice(_Args):
    """Create the customer's invoice for one billing period (at most one per customer and period)."""

    customer_id: CustomerId
    billing_period: BillingPeriod
    amount_cents: Cents


class QueueCharge(_Args):
    """Charge the customer's card for an existing invoice; the payment is sent after the batch commits."""

    customer_id: CustomerId
    billing_period: BillingPeriod
    amount_cents: PaymentCents


class CreateCreditMemo(_Args):
    """Record a credit memo for a customer under a business reference (one per customer and reference)."""

    customer_id: CustomerId
    reference: Reference
    amount_cents: Cents
    reason: Annotated[str, Field(strict=True, max_length=200)] = ""
    invoice_id: Annotated[int, Field(strict=True, gt=0, le=MAX_ID)] | None = None


class QueueRefund(_Args):
    """Refund money to the customer's card under a business reference; sent after the batch commits."""

    customer_id: CustomerId
    reference: Reference
    amount_cents: PaymentCents


class ListRefunds(_Args):
    """List a customer's refunds created in a date window (from_date <= to_date, at most 366 days). Read only."""

    customer_id: CustomerId
    from_date: IsoDate
    to_date: IsoDate

    @model_validator(mode="after")
    def _window(self) -> ListRefunds:
        if self.from_date > self.to_date:
            raise ValueError("from_date must be on or before to_date; swap the two dates")
        if self.to_date - self.from_date > timedelta(days=366):
            raise ValueError("the window is longer than 366 days; ask for a shorter one")
        return self


# --------------------------------------------------------------------------- SQL

LOOKUP_CUSTOMER = """
SELECT c.id, c.name, c.credit_cents,
       (SELECT count(*) FROM invoices i WHERE i.customer_id = c.id AND i.status = 'open')
FROM customers c WHERE c.id = %s
"""
APPLY_CREDIT = "UPDATE customers SET credit_cents = credit_cents - %s WHERE id = %s RETURNING credit_cents"
CREATE_INVOICE = """
INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents)
SELECT c.tenant_id, c.id, %s, %s FROM customers c WHERE c.id = %s
RETURNING id
"""
FIND_INVOICE = "SELECT id, amount_cents, tenant_id FROM invoices WHERE customer_id = %s AND billing_period = %s"
CREATE_CREDIT_MEMO = """
INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents, reason)
SELECT c.tenant_id, c.id, %s, %s, %s FROM customers c WHERE c.id = %s
RETURNING id
"""
CREATE_CREDIT_MEMO_FOR_INVOICE = """
INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents, reason, invoice_id)
SELECT c.tenant_id, c.id, %s, %s, %s, %s FROM customers c WHERE c.id = %s
RETURNING id
"""
CREATE_REFUND = """
INSERT INTO refunds (tenant_id, customer_id, reference, amount_cents)
SELECT c.tenant_id, c.id, %s, %s FROM customers c WHERE c.id = %s
RETURNING id
"""
LIST_REFUNDS = """
SELECT id, reference, amount_cents, status FROM refunds
WHERE customer_id = %s AND created_at >= %s AND created_at < %s + 1 ORDER BY id
"""
CUSTOMER_EXISTS = "SELECT 1 FROM customers WHERE id = %s"


def charge_dedupe_key(customer_id: int, billing_period: date | str) -> str:
    """The outbox dedupe key (and provider idempotency key) of an invoice's charge: its natural key."""
    return f"charge:{customer_id}:{billing_period}"


def refund_dedupe_key(customer_id: int, reference: str) -> str:
    """The outbox dedupe key (and provider idempotency key) of a refund: customer and reference."""
    return f"refund:{customer_id}:{reference}"


# --------------------------------------------------------------------------- handlers




async def _one(conn: AsyncConnection, query: str, params: tuple) -> tuple | None:
    cur = await conn.execute(query, params)
    return await cur.fetchone()


async def lookup_customer(conn, args, ctx) -> dict:
    row = await _one(conn, LOOKUP_CUSTOMER, (args["customer_id"],))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    return {"customer_id": row[0], "name": row[1], "available_credit_cents": row[2], "open_invoices": row[3]}


async def apply_credit(conn, args, ctx) -> dict:
    row = await _one(conn, APPLY_CREDIT, (args["amount_cents"], args["customer_id"]))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    return {"customer_id": args["customer_id"], "applied_cents": args["amount_cents"], "remaining_credit_cents": row[0]}


async def create_invoice(conn, args, ctx) -> dict:
    row = await _one(conn, CREATE_INVOICE, (args["billing_period"], args["amount_cents"], args["customer_id"]))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    return {
        "invoice_id": row[0], "customer_id": args["customer_id"],
        "billing_period": str(args["billing_period"]), "amount_cents": args["amount_cents"],
    }


async def queue_charge(conn, args, ctx) -> dict:
    customer_id, period, amount = args["customer_id"], args["billing_period"], args["amount_cents"]
    invoice = await _one(conn, FIND_INVOICE, (customer_id, period))
    if invoice is None:
        raise NotFound("this customer has no invoice for that billing period yet; create the invoice first.")
    if amount > invoice[1]:
        raise ToolError("the charge is larger than the invoice; charge at most the invoice amount.", Category.BUSINESS_RULE)
    key = charge_dedupe_key(customer_id, period)
    payload = {"customer_id": customer_id, "invoice_id": invoice[0], "amount_cents": amount, "billing_period": str(period)}
    return await send_payment(conn, ctx, CHARGE_TOPIC, key, payload, {"invoice_id": invoice[0], "amount_cents": amount})


async def create_credit_memo(conn, args, ctx) -> dict:
    reason = args.get("reason", "")
    if args.get("invoice_id") is not None:
        row = await _one(
            conn, CREATE_CREDIT_MEMO_FOR_INVOICE,
            (args["reference"], args["amount_cents"], reason, args["invoice_id"], args["customer_id"]),
        )
    else:
        row = await _one(conn, CREATE_CREDIT_MEMO, (args["reference"], args["amount_cents"], reason, args["customer_id"]))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    return {"credit_memo_id": row[0], "reference": args["reference"], "amount_cents": args["amount_cents"]}


async def queue_refund(conn, args, ctx) -> dict:
    customer_id, reference, amount = args["customer_id"], args["reference"], args["amount_cents"]
    row = await _one(conn, CREATE_REFUND, (reference, amount, customer_id))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    key = refund_dedupe_key(customer_id, reference)
    payload = {"customer_id": customer_id, "refund_id": row[0], "amount_cents": amount, "reference": reference}
    return await send_payment(conn, ctx, REFUND_TOPIC, key, payload, {"refund_id": row[0], "amount_cents": amount})


async def list_refunds(conn, args, ctx) -> dict:
    if await _one(conn, CUSTOMER_EXISTS, (args["customer_id"],)) is None:
        raise NotFound("no customer has this id; check the customer id.")
    cur = await conn.execute(LIST_REFUNDS, (args["customer_id"], args["from_date"], args["to_date"]))
    rows = await cur.fetchall()
    return {"refunds": [{"refund_id": r[0], "reference": r[1], "amount_cents": r[2], "status": r[3]} for r in rows]}


# --------------------------------------------------------------------------- registry


TOOLS = Toolset((
    tool(LookupCustomer, lookup_customer, writes=False),
    tool(ListRefunds, list_refunds, writes=False),
    tool(ApplyCredit, apply_credit, writes=True),
    tool(CreateInvoice, create_invoice, writes=True),
    tool(QueueCharge, queue_charge, writes=True, external=True),
    tool(CreateCreditMemo, create_credit_memo, writes=True),
    tool(QueueRefund, queue_refund, writes=True, external=True),
))


def get_tool(name: Any) -> ToolSpec:
    """The billing tool named ``name``. Raises UnknownTool (model-facing, lists the known tools)."""
    return TOOLS.get_tool(name)


def tool_schemas() -> list[dict]:
    """The billing tools in OpenAI function format for ``bind_tools`` (a list of new dicts per call)."""
    return TOOLS.schemas()
