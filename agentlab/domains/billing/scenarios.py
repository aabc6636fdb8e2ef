"""Scripted scenarios: what the simulated model will try, and the end state that was intended.

A :class:`Scenario` names the customers an episode creates (its own rows, so episodes on one
database never touch each other's data), the batches of tool calls the model emits, and the
intended end state the invariant checker compares the database with. Arguments refer to the
episode's customers by position (``C(0)``); :meth:`Scenario.script` turns them into real ids.

A planned call may carry a hallucination: ``args`` is what the model sends first, ``fix`` what it
sends once told which argument is wrong, as an LLM does after a FAILED message naming a field.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.core.scenario import C, PlannedCall, Scenario


@dataclass(frozen=True)
class CustomerSpec:
    """A customer an episode creates: tenant, name, opening credit in cents."""

    tenant_id: str
    name: str
    credit_cents: int


@dataclass(frozen=True)
class Intended:
    """The end state a scenario means to reach (per customer position unless noted).

    ``final_credit_cents``: balance after the intended deductions; ``invoices``, ``credit_memos``,
    ``refunds``: rows per customer; ``provider_charges`` / ``provider_refunds``: payments at the
    provider per customer once the outbox has drained.
    """

    final_credit_cents: tuple[int, ...]
    invoices: tuple[int, ...] = ()
    credit_memos: tuple[int, ...] = ()
    refunds: tuple[int, ...] = ()
    provider_charges: tuple[int, ...] = ()
    provider_refunds: tuple[int, ...] = ()


REFUND = Scenario(
    name="refund",
    title="Refund story: credit memo, deduct the credit, refund to the card",
    prompt=("Customer returned order RMA-1042 worth 25.00. Record a credit memo, deduct it from the "
            "customer's store credit and refund it to their card."),
    customers=(CustomerSpec("acme", "Acme Analytics", 5000),),
    steps=((
        PlannedCall("CreateCreditMemo", {"customer_id": C(0), "reference": "RMA-1042", "amount_cents": 2500,
                                         "reason": "returned order"}),
        PlannedCall("ApplyCredit", {"customer_id": C(0), "amount_cents": 2500}),
        # the seed's hallucination: the id arrives as text with a stray quote
        PlannedCall("QueueRefund", {"customer_id": C(0, quote=True), "reference": "RMA-1042", "amount_cents": 2500},
                    fix={"customer_id": C(0), "reference": "RMA-1042", "amount_cents": 2500}),
    ),),
    intended=Intended(final_credit_cents=(2500,), credit_memos=(1,), refunds=(1,), provider_refunds=(1,),
                      invoices=(0,), provider_charges=(0,)),
)

INVOICE = Scenario(
    name="invoice",
    title="Invoice and charge: create the invoice, apply credit, charge the rest",
    prompt=("Invoice the customer 120.00 for March 2026, use their store credit towards it and charge "
            "the rest to their card."),
    customers=(CustomerSpec("acme", "Acme Labs", 4000),),
    steps=((
        PlannedCall("CreateInvoice", {"customer_id": C(0), "billing_period": "2026-03-01", "amount_cents": 12000}),
        # over the balance: breaks the CHECK; told the limit, the model applies what is available
        PlannedCall("ApplyCredit", {"customer_id": C(0), "amount_cents": 5000},
                    fix={"customer_id": C(0), "amount_cents": 4000}),
        PlannedCall("QueueCharge", {"customer_id": C(0), "billing_period": "2026-03-01", "amount_cents": 8000}),
    ),),
    intended=Intended(final_credit_cents=(0,), invoices=(1,), provider_charges=(1,), credit_memos=(0,),
                      refunds=(0,), provider_refunds=(0,)),
)

TOPUP = Scenario(
    name="topup",
    title="Credit top-up: invoice the credit bought, charge the card, record the credit granted",
    prompt=("The customer buys 30.00 of store credit. Invoice the top-up for April 2026, charge their card "
            "and record the credit granted as credit memo TOPUP-2026-04."),
    customers=(CustomerSpec("acme", "Acme Retail", 1000),),
    steps=((
        PlannedCall("CreateInvoice", {"customer_id": C(0), "billing_period": "2026-04-01", "amount_cents": 3000}),
        PlannedCall("QueueCharge", {"customer_id": C(0), "billing_period": "2026-04-01", "amount_cents": 3000}),
        PlannedCall("CreateCreditMemo", {"customer_id": C(0), "reference": "TOPUP-2026-04", "amount_cents": 3000,
                                         "reason": "store credit top-up"}),
    ),),
    # The credit memo is the grant: no tool raises a balance column (ApplyCredit only deducts), so the
    # balance stays at its opening value and any balance that rises is a corruption.
    intended=Intended(final_credit_cents=(1000,), invoices=(1,), provider_charges=(1,), credit_memos=(1,),
                      refunds=(0,), provider_refunds=(0,)),
)

BATCH = Scenario(
    name="batch",
    title="Month-end batch: invoice three customers, apply their credit, charge what is left",
    prompt=("Month-end for March 2026: invoice Acme North 50.00, Acme South 20.00 and Acme West 60.00, use "
            "each customer's store credit towards their invoice and charge the rest to their cards."),
    customers=(CustomerSpec("acme", "Acme North", 3000), CustomerSpec("acme", "Acme South", 0),
               CustomerSpec("acme", "Acme West", 8000)),
    steps=(
        (
            PlannedCall("CreateInvoice", {"customer_id": C(0), "billing_period": "2026-03-01", "amount_cents": 5000}),
            PlannedCall("CreateInvoice", {"customer_id": C(1), "billing_period": "2026-03-01", "amount_cents": 2000}),
            PlannedCall("CreateInvoice", {"customer_id": C(2), "billing_period": "2026-03-01", "amount_cents": 6000}),
            PlannedCall("ApplyCredit", {"customer_id": C(0), "amount_cents": 3000}),
            PlannedCall("ApplyCredit", {"customer_id": C(2), "amount_cents": 6000}),
        ),
        (
            PlannedCall("QueueCharge", {"customer_id": C(0), "billing_period": "2026-03-01", "amount_cents": 2000}),
            PlannedCall("QueueCharge", {"customer_id": C(1), "billing_period": "2026-03-01", "amount_cents": 2000}),
        ),
    ),
    # West's credit covers its invoice: no charge for it.
    intended=Intended(final_credit_cents=(0, 0, 2000), invoices=(1, 1, 1), provider_charges=(1, 1, 0),
                      credit_memos=(0, 0, 0), refunds=(0, 0, 0), provider_refunds=(0, 0, 0)),
)

REORDER = Scenario(
    name="reorder",
    title="Dependent calls in the wrong order: the charge is sent before the invoice it needs",
    prompt="Invoice the customer 45.00 for May 2026 and charge it to their card.",
    customers=(CustomerSpec("acme", "Acme Media", 0),),
    steps=((
        # QueueCharge needs the invoice; told "create the invoice first", the model resends it after its sibling
        PlannedCall("QueueCharge", {"customer_id": C(0), "billing_period": "2026-05-01", "amount_cents": 4500},
                    reorder=True),
        PlannedCall("CreateInvoice", {"customer_id": C(0), "billing_period": "2026-05-01", "amount_cents": 4500}),
    ),),
    intended=Intended(final_credit_cents=(0,), invoices=(1,), provider_charges=(1,), credit_memos=(0,),
                      refunds=(0,), provider_refunds=(0,)),
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (REFUND, INVOICE, TOPUP, BATCH, REORDER)}


def get_scenario(name: str) -> Scenario:
    """The named scenario. Raises ValueError naming the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}") from None


INSERT_CUSTOMER = "INSERT INTO {schema}.customers (tenant_id, name, credit_cents) VALUES (%s, %s, %s) RETURNING id"
INSERT_CUSTOMERS = """
INSERT INTO {schema}.customers (tenant_id, name, credit_cents)
SELECT t, n, c FROM unnest(%s::text[], %s::text[], %s::bigint[]) WITH ORDINALITY AS u(t, n, c, pos)
ORDER BY pos
RETURNING id
"""


async def create_customers(conn, specs: tuple[CustomerSpec, ...] | list[CustomerSpec], schema: str) -> list[int]:
    """Insert an episode's customers into ``schema`` (``public`` or ``lax``) in one statement; return
    their ids in order (ids come from one sequence, so they ascend with the insert order)."""
    from psycopg import sql

    query = sql.SQL(INSERT_CUSTOMERS).format(schema=sql.Identifier(schema))
    cur = await conn.execute(query, ([s.tenant_id for s in specs], [s.name for s in specs],
                                     [s.credit_cents for s in specs]))
    return sorted(r[0] for r in await cur.fetchall())
