"""Billing's invariants: what must hold of its customers, records and payments after an episode, read from
the database and the provider's records, never from the code's own bookkeeping.

The scenario's :class:`agentlab.domains.billing.scenarios.Intended` says what the episode meant to do. A
record's identity is its natural key (customer and billing period for an invoice, customer and reference
for a credit memo or refund); a tool call names it in its arguments. :data:`INVARIANTS` are the domain's
``invariants`` (:class:`agentlab.core.domain.Invariant`), one per kind, in this order:

=======================  =====================================================================
``duplicate_invoice``    more than one invoice for one customer and billing period
``negative_balance``     a customer's credit balance is below zero
``balance_mismatch``     a balance differs from its opening value minus the intended deductions
``record_count``         invoices, credit memos or refunds per customer differ from the intended
``payment_count``        charges or refunds at the provider per customer (after the outbox drained)
                         differ from the intended: an intent lost, or paid twice (replaces the lab's
                         generic per-intent check for billing)
``dangling_reference``   a credit memo names an invoice that does not exist
``cross_tenant_effect``  a row, payment intent, payment, balance change or answered read for a customer
                         of another tenant than the thread's (:mod:`agentlab.domains.billing.tenancy`)
``applied_but_missing``  the model was told a record was created, and the database does not hold it
``unreported_effect``    the database holds a record the model was never told was created
=======================  =====================================================================

All of them read one round trip per episode (:func:`read_episode`, kept in the context's ``memo``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from agentlab.core.domain import Invariant, InvariantContext, Violation
from agentlab.core.outbox import customer_ref
from agentlab.domains.billing.scenarios import Intended, Scenario
from agentlab.domains.billing.tenancy import CrossTenantEffect, effect_counts_query, effects_from

STATE_KINDS = ("duplicate_invoice", "negative_balance", "balance_mismatch", "record_count", "payment_count",
               "dangling_reference")
REPORT_KINDS = ("applied_but_missing", "unreported_effect")

# One row per customer: tenant, balance, and its records as JSON arrays (natural keys).
CUSTOMER_RECORDS = """
SELECT c.id, c.tenant_id, c.credit_cents,
       (SELECT coalesce(json_agg(i.billing_period::text), '[]') FROM {s}.invoices i WHERE i.customer_id = c.id),
       (SELECT coalesce(json_agg(json_build_array(m.reference, m.invoice_id IS NOT NULL AND NOT EXISTS
                   (SELECT 1 FROM {s}.invoices x WHERE x.id = m.invoice_id))), '[]')
          FROM {s}.credit_memos m WHERE m.customer_id = c.id),
       (SELECT coalesce(json_agg(r.reference), '[]') FROM {s}.refunds r WHERE r.customer_id = c.id)
FROM {s}.customers c WHERE c.id = ANY(%(ids)s)
"""
# the customer rows, the provider's payments per customer and kind, and the ledger's call ids for the
# thread, in one round trip, as JSON
EPISODE_RECORDS = """
SELECT (SELECT coalesce(json_agg(json_build_array(c.id, c.tenant_id, c.credit_cents, c.invoices, c.memos, c.refunds)),
                        '[]') FROM ({customers}) AS c(id, tenant_id, credit_cents, invoices, memos, refunds)),
       (SELECT coalesce(json_agg(json_build_array(p.customer, p.kind, p.n)), '[]')
          FROM (SELECT customer, kind, count(*) AS n FROM provider.payments WHERE customer = ANY(%(refs)s)
                GROUP BY 1, 2) AS p),
       (SELECT coalesce(json_agg(tool_call_id), '[]') FROM tool_executions WHERE thread_id = %(thread)s)
"""

CREATES = {"CreateInvoice": ("invoice", "billing_period"), "CreateCreditMemo": ("credit_memo", "reference"),
           "QueueRefund": ("refund", "reference"), "RefundWithinCap": ("refund", "reference")}
"""The tools that create a record: tool name -> (record kind, the argument naming its natural key)."""


@dataclass(frozen=True)
class CustomerRecords:
    """What the database and the provider hold for one customer."""

    customer_id: int
    tenant_id: str
    credit_cents: int
    invoices: tuple[str, ...]  # billing periods, ISO dates
    credit_memos: tuple[str, ...]  # references
    dangling_memos: int
    refunds: tuple[str, ...]  # references
    charges: int
    provider_refunds: int


def records_query(schema: str, customer_ids: list[int], thread_id: str | None) -> tuple[sql.Composed, dict[str, Any]]:
    """One statement for each customer's rows in ``schema``, its payments in the provider's records and the
    ledger's call ids for ``thread_id``, and its parameters (:func:`records_from` reads its row)."""
    customers = sql.SQL(CUSTOMER_RECORDS).format(s=sql.Identifier(schema))
    query = sql.SQL(EPISODE_RECORDS).format(customers=customers)
    return query, {"ids": customer_ids, "refs": [customer_ref(i) for i in customer_ids], "thread": thread_id}


def records_from(row: tuple) -> tuple[dict[int, CustomerRecords], set[str]]:
    """:func:`records_query`'s row as ``({customer id: CustomerRecords}, ledger call ids)``."""
    rows, pays, ledger = row
    paid = {(c, k): n for c, k, n in _json(pays)}
    out = {}
    for cid, tenant, credit, invoices, memos, refunds in _json(rows):
        memos = _json(memos)
        out[cid] = CustomerRecords(
            cid, tenant, credit, tuple(_json(invoices)), tuple(m[0] for m in memos), sum(bool(m[1]) for m in memos),
            tuple(_json(refunds)), paid.get((customer_ref(cid), "charge"), 0), paid.get((customer_ref(cid), "refund"), 0),
        )
    return out, set(_json(ledger))


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _at(values: tuple[int, ...], pos: int) -> int | None:
    return values[pos] if pos < len(values) else None


def state_violations(tid: str, ids: list[int], scenario: Scenario,
                     records: dict[int, CustomerRecords]) -> list[Violation]:
    """The :data:`STATE_KINDS` violations of ``records`` against ``scenario.intended``, customer by customer
    (pure: tests feed it broken states)."""
    out: list[Violation] = []
    want: Intended = scenario.intended
    for pos, cid in enumerate(ids):
        r = records.get(cid)
        if r is None:
            out.append(Violation("record_count", tid, f"customer {cid} is missing"))
            continue
        for period, n in Counter(r.invoices).items():
            if n > 1:
                out.append(Violation("duplicate_invoice", tid, f"customer {cid}: {n} invoices for {period}"))
        if r.credit_cents < 0:
            out.append(Violation("negative_balance", tid, f"customer {cid}: balance {r.credit_cents} cents"))
        final = _at(want.final_credit_cents, pos)
        if final is not None and r.credit_cents != final:
            out.append(Violation("balance_mismatch", tid,
                                 f"customer {cid}: balance {r.credit_cents} cents, intended {final}"))
        for name, have in (("invoices", len(r.invoices)), ("credit_memos", len(r.credit_memos)),
                           ("refunds", len(r.refunds))):
            n = _at(getattr(want, name), pos)
            if n is not None and have != n:
                out.append(Violation("record_count", tid, f"customer {cid}: {have} {name}, intended {n}"))
        for name, have in (("provider_charges", r.charges), ("provider_refunds", r.provider_refunds)):
            n = _at(getattr(want, name), pos)
            if n is not None and have != n:
                out.append(Violation("payment_count", tid, f"customer {cid}: {have} {name}, intended {n}"))
        if r.dangling_memos:
            out.append(Violation("dangling_reference", tid,
                                 f"customer {cid}: {r.dangling_memos} credit memo(s) name a missing invoice"))
    return out


def record_key(tc: dict) -> tuple[str, str, str] | None:
    """``(record kind, customer id, natural key)`` of the record tool call ``tc`` creates, or None."""
    spec = CREATES.get(tc.get("name"))
    args = tc.get("args")
    if spec is None or not isinstance(args, dict):
        return None
    return spec[0], str(args.get("customer_id")), str(args.get(spec[1]))


def effect_violations(tid: str, ids: list[int], applied: Iterable[dict],
                      records: dict[int, CustomerRecords]) -> list[Violation]:
    """``applied_but_missing`` and ``unreported_effect``: the records the model was told were created
    (``applied``: the calls reported applied) against the records stored for ``ids`` (pure)."""
    out: list[Violation] = []
    mine = {str(i) for i in ids}  # records of customers outside the episode are not its to judge
    told = {k for k in (record_key(tc) for tc in applied) if k is not None and k[1] in mine}
    held: set[tuple[str, str, str]] = set()
    for cid in ids:
        r = records.get(cid)
        if r is None:
            continue
        held |= {("invoice", str(cid), p) for p in r.invoices}
        held |= {("credit_memo", str(cid), ref) for ref in r.credit_memos}
        held |= {("refund", str(cid), ref) for ref in r.refunds}
    for kind, cid, key in sorted(told - held):
        out.append(Violation("applied_but_missing", tid, f"{kind} {key} of customer {cid} reported created, not stored"))
    for kind, cid, key in sorted(held - told):
        out.append(Violation("unreported_effect", tid, f"{kind} {key} of customer {cid} stored, never reported created"))
    return out


def cross_tenant_violations(tid: str, tenant_id: str | None,
                            effects: Iterable[CrossTenantEffect]) -> list[Violation]:
    """One ``cross_tenant_effect`` violation per effect on another tenant's customer."""
    return [Violation("cross_tenant_effect", tid, f"customer {e.customer_id} of tenant {e.customer_tenant} "
                      f"(thread tenant {tenant_id}): {e.rows} {e.kind}" + (f", {e.detail}" if e.detail else ""))
            for e in effects]


@dataclass(frozen=True)
class EpisodeRecords:
    """What one round trip reads for an episode: its customers' records, the ledger's call ids for the
    thread, and the effects on other tenants' customers."""

    records: dict[int, CustomerRecords]
    ledger: set[str]
    cross_tenant: list[CrossTenantEffect]


async def read_episode(ctx: InvariantContext) -> EpisodeRecords:
    """The episode's :class:`EpisodeRecords` (both statements in one pipeline), read once per context."""
    if "billing" in ctx.memo:
        return ctx.memo["billing"]
    opening = {cid: spec.credit_cents for cid, spec in zip(ctx.ids, ctx.scenario.customers)}
    records_sql, records_params = records_query(ctx.schema, ctx.ids, ctx.thread_id)
    effects_sql, effects_params = effect_counts_query(ctx.schema, ctx.tenant_id, ctx.ids, messages=ctx.messages)
    async with ctx.conn.pipeline():  # both statements, one round trip
        records_cur = await ctx.conn.execute(records_sql, records_params)
        effects_cur = await ctx.conn.execute(effects_sql, effects_params)
    records, ledger = records_from(await records_cur.fetchone())
    foreign = effects_from(await effects_cur.fetchall(), messages=ctx.messages, opening_credit_cents=opening)
    ctx.memo["billing"] = read = EpisodeRecords(records, ledger, foreign)
    return read


async def episode_violations(ctx: InvariantContext) -> list[Violation]:
    """Every billing violation of the episode, in :data:`INVARIANTS`' order of kinds (computed once per
    context; each invariant takes its own kind)."""
    if "billing_violations" not in ctx.memo:
        read = await read_episode(ctx)
        ctx.memo["billing_violations"] = [
            *state_violations(ctx.thread_id, ctx.ids, ctx.scenario, read.records),
            *cross_tenant_violations(ctx.thread_id, ctx.tenant_id, read.cross_tenant),
            *effect_violations(ctx.thread_id, ctx.ids, ctx.applied, read.records),
        ]
    return ctx.memo["billing_violations"]


def _of_kind(kind: str):
    async def check(ctx: InvariantContext) -> list[str]:
        return [v.detail for v in await episode_violations(ctx) if v.kind == kind]

    check.__name__ = f"check_{kind}"
    return check


DESCRIPTIONS = {
    "duplicate_invoice": "one invoice per customer and billing period",
    "negative_balance": "no credit balance below zero",
    "balance_mismatch": "each balance is its opening value minus the intended deductions",
    "record_count": "invoices, credit memos and refunds per customer as intended",
    "payment_count": "charges and refunds at the provider per customer as intended, once drained",
    "dangling_reference": "a credit memo names an invoice that exists",
    "cross_tenant_effect": "nothing written, paid or read for another tenant's customer",
    "applied_but_missing": "every record the model was told was created is stored",
    "unreported_effect": "every stored record was reported created to the model",
}

INVARIANTS: tuple[Invariant, ...] = tuple(Invariant(kind, _of_kind(kind), description)
                                          for kind, description in DESCRIPTIONS.items())
"""Billing's invariants, one per kind (the module docstring's table)."""
