"""Billing tools that check before they act: a balance (``RedeemCredit``) and a daily refund cap
(``RefundWithinCap``), and the scenarios that use them.

Each reads a value in one statement and acts on what it read in the next, as a tool written the
straightforward way does (``balance = read(); if balance < amount: refuse; write(balance - amount)``,
the ORM's ``customer.credit -= amount``). Alone on its rows that is correct. Two conversations acting on
one customer at once are not alone (:mod:`agentlab.lab.concurrency`):

- ``RedeemCredit`` writes the balance it computed, an absolute value: two redemptions that both read
  5,000 cents both write their own result and one deduction is lost (a *lost update*); two that each fit
  the balance alone both pass the check (*check then act*) and more is redeemed than there was;
- ``RefundWithinCap`` sums the customer's refunds of the day and inserts one more when the sum stays
  under :data:`DAILY_REFUND_CAP_CENTS`: two refunds that each fit both read the same sum and both insert
  (*write skew*: each transaction writes a row the other's check read around).

With ``row_locks`` on (:class:`agentlab.core.safeguards.Safeguards`) each tool first locks the customer's
row (``SELECT ... FOR UPDATE``): the second conversation waits at its read until the first commits, and
reads the new balance or sum. The customer row is the lock for the refunds under the cap ("materializing
the conflict"): every tool that writes under the cap locks it first. Under ``repeatable read`` the late
writer of the same row fails with SQLSTATE 40001 and is retried; write skew passes repeatable read and
only ``serializable`` (or the lock) stops it.

Every applied redemption leaves a ``limits.credit_redemptions`` row (amount, balance written) in the same
transaction as the balance, so the lost update is visible in the database: the balance differs from the
opening balance minus the redemptions.

Sources: PostgreSQL docs "Transaction Isolation" (13.2), "Explicit Locking" (13.3, row-level locks),
"Serializable Snapshot Isolation" (Ports and Grittner, VLDB 2012); Berenson et al., "A Critique of ANSI
SQL Isolation Levels" (1995) for lost update and write skew.
"""

from __future__ import annotations

from agentlab.core.errors import Category, NotFound, ToolError
from agentlab.core.outbox import REFUND_TOPIC, send_payment
from agentlab.core.scenario import C, PlannedCall, Scenario
from agentlab.core.toolspec import StrictArgs, Toolset, tool
from agentlab.domains.billing.scenarios import CustomerSpec, Intended
from agentlab.domains.billing.tools import CREATE_REFUND, Cents, CustomerId, PaymentCents, Reference, refund_dedupe_key

DAILY_REFUND_CAP_CENTS = 5000  # at most this much refunded to one customer per calendar day (server time)


class RedeemCredit(StrictArgs):
    """Redeem amount_cents of the customer's store credit; refused when the credit does not cover it."""

    customer_id: CustomerId
    amount_cents: Cents


class RefundWithinCap(StrictArgs):
    """Refund money to the customer's card under a business reference, within the daily refund cap per
    customer (5000 cents a day); refused when the day's refunds would exceed the cap."""

    customer_id: CustomerId
    reference: Reference
    amount_cents: PaymentCents


READ_CREDIT = "SELECT tenant_id, credit_cents FROM customers WHERE id = %s"
READ_CREDIT_LOCKED = READ_CREDIT + " FOR UPDATE"
WRITE_CREDIT = "UPDATE customers SET credit_cents = %s WHERE id = %s"
RECORD_REDEMPTION = """
INSERT INTO limits.credit_redemptions (tenant_id, customer_id, amount_cents, balance_after_cents) VALUES (%s, %s, %s, %s)
RETURNING id
"""
LOCK_CUSTOMER = "SELECT id FROM customers WHERE id = %s FOR UPDATE"
CUSTOMER_EXISTS = "SELECT id FROM customers WHERE id = %s"
REFUNDED_TODAY = """
SELECT coalesce(sum(amount_cents), 0) FROM refunds WHERE customer_id = %s AND created_at >= date_trunc('day', now())
"""


async def _one(conn, query: str, params: tuple) -> tuple | None:
    return await (await conn.execute(query, params)).fetchone()


def _locks(ctx) -> bool:
    return bool(getattr(getattr(ctx, "safeguards", None), "row_locks", False))


async def redeem_credit(conn, args, ctx) -> dict:
    customer_id, amount = args["customer_id"], args["amount_cents"]
    row = await _one(conn, READ_CREDIT_LOCKED if _locks(ctx) else READ_CREDIT, (customer_id,))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    tenant_id, balance = row
    if amount > balance:
        raise ToolError(f"the customer's credit is {balance} cents; redeem at most that.", Category.BUSINESS_RULE)
    remaining = balance - amount
    await conn.execute(WRITE_CREDIT, (remaining, customer_id))
    await conn.execute(RECORD_REDEMPTION, (tenant_id, customer_id, amount, remaining))
    return {"customer_id": customer_id, "redeemed_cents": amount, "remaining_credit_cents": remaining}


async def refund_within_cap(conn, args, ctx) -> dict:
    customer_id, reference, amount = args["customer_id"], args["reference"], args["amount_cents"]
    if await _one(conn, LOCK_CUSTOMER if _locks(ctx) else CUSTOMER_EXISTS, (customer_id,)) is None:
        raise NotFound("no customer has this id; check the customer id.")
    (refunded,) = await _one(conn, REFUNDED_TODAY, (customer_id,))
    if refunded + amount > DAILY_REFUND_CAP_CENTS:
        room = max(0, DAILY_REFUND_CAP_CENTS - refunded)
        raise ToolError(f"the daily refund cap is {DAILY_REFUND_CAP_CENTS} cents and {refunded} cents were refunded "
                        f"today; refund at most {room} cents today.", Category.BUSINESS_RULE)
    row = await _one(conn, CREATE_REFUND, (reference, amount, customer_id))
    if row is None:
        raise NotFound("no customer has this id; check the customer id.")
    payload = {"customer_id": customer_id, "refund_id": row[0], "amount_cents": amount, "reference": reference}
    return await send_payment(conn, ctx, REFUND_TOPIC, refund_dedupe_key(customer_id, reference), payload,
                              {"refund_id": row[0], "amount_cents": amount})


LIMIT_TOOLS = (
    tool(RedeemCredit, redeem_credit, writes=True),
    tool(RefundWithinCap, refund_within_cap, writes=True, external=True),
)


REDEEM = Scenario(
    name="redeem",
    title="Redeem store credit: check the balance, write the new one",
    prompt="The customer spends 20.00 of their store credit on an order; redeem it.",
    customers=(CustomerSpec("acme", "Acme Goods", 5000),),
    steps=((PlannedCall("RedeemCredit", {"customer_id": C(0), "amount_cents": 2000}),),),
    intended=Intended(final_credit_cents=(3000,), invoices=(0,), credit_memos=(0,), refunds=(0,),
                      provider_charges=(0,), provider_refunds=(0,)),
)

CAPPED_REFUND = Scenario(
    name="capped_refund",
    title="A refund under the daily cap: sum the day's refunds, add one",
    prompt="Refund 30.00 to the customer's card for return RMA-2001, within their daily refund cap.",
    customers=(CustomerSpec("acme", "Acme Outlet", 0),),
    steps=((PlannedCall("RefundWithinCap", {"customer_id": C(0), "reference": "RMA-2001", "amount_cents": 3000}),),),
    intended=Intended(final_credit_cents=(0,), invoices=(0,), credit_memos=(0,), refunds=(1,),
                      provider_charges=(0,), provider_refunds=(1,)),
)

LIMIT_SCENARIOS: dict[str, Scenario] = {s.name: s for s in (REDEEM, CAPPED_REFUND)}


def with_limit_tools(toolset: Toolset) -> Toolset:
    """``toolset`` and the two tools of this module (a new Toolset)."""
    return Toolset((*toolset.values(), *LIMIT_TOOLS))
