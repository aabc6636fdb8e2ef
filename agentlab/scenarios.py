"""Scripted scenarios: what the simulated model will try, and the end state that was intended.

A :class:`Scenario` names the customers an episode creates (its own rows, so episodes on one
database never touch each other's data), the batches of tool calls the model emits, and the
intended end state the invariant checker compares the database with. Arguments refer to the
episode's customers by position (``C(0)``); :meth:`Scenario.script` turns them into real ids.

A planned call may carry a hallucination: ``args`` is what the model sends first, ``fix`` what it
sends once told which argument is wrong, as an LLM does after a FAILED message naming a field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class C:
    """A reference to the episode's ``index``-th customer id; ``quote`` adds a stray quote (``"12'"``)."""

    index: int
    quote: bool = False


def _resolve(value: Any, ids: list[int]) -> Any:
    if isinstance(value, C):
        return f"{ids[value.index]}'" if value.quote else ids[value.index]
    if isinstance(value, dict):
        return {k: _resolve(v, ids) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, ids) for v in value)
    return value


@dataclass(frozen=True)
class PlannedCall:
    """One tool call the model will make.

    Attributes:
        tool: the tool's name.
        args: the arguments sent first (may be hallucinated).
        fix: the arguments sent after a FAILED message asks for a correction (None: nothing to fix).
        reorder: on a FAILED "create it first", resend this call after its siblings.
    """

    tool: str
    args: dict
    fix: dict | None = None
    reorder: bool = False

    def resolve(self, ids: list[int]) -> "PlannedCall":
        return dataclasses.replace(self, args=_resolve(self.args, ids),
                                   fix=_resolve(self.fix, ids) if self.fix is not None else None)


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


@dataclass(frozen=True)
class Scenario:
    """A scripted scenario. ``steps`` are batches (one AIMessage each), in order."""

    name: str
    title: str
    prompt: str
    customers: tuple[CustomerSpec, ...]
    steps: tuple[tuple[PlannedCall, ...], ...]
    intended: Intended
    tenant_id: str = "acme"

    def script(self, ids: list[int]) -> list[list[PlannedCall]]:
        """The steps with customer references replaced by the episode's ids."""
        return [[call.resolve(ids) for call in step] for step in self.steps]

    def with_call(self, step: int, index: int, **changes) -> "Scenario":
        """A copy with one planned call changed (used by faults that hallucinate an argument)."""
        steps = [list(s) for s in self.steps]
        steps[step][index] = dataclasses.replace(steps[step][index], **changes)
        return dataclasses.replace(self, steps=tuple(tuple(s) for s in steps))


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

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (REFUND, INVOICE)}


def get_scenario(name: str) -> Scenario:
    """The named scenario. Raises ValueError naming the known ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}") from None


INSERT_CUSTOMER = "INSERT INTO {schema}.customers (tenant_id, name, credit_cents) VALUES (%s, %s, %s) RETURNING id"


async def create_customers(conn, specs: tuple[CustomerSpec, ...] | list[CustomerSpec], schema: str) -> list[int]:
    """Insert an episode's customers into ``schema`` (``public`` or ``lax``); return their ids in order."""
    from psycopg import sql

    query = sql.SQL(INSERT_CUSTOMER).format(schema=sql.Identifier(schema))
    ids = []
    for spec in specs:
        cur = await conn.execute(query, (spec.tenant_id, spec.name, spec.credit_cents))
        ids.append((await cur.fetchone())[0])
    return ids
