"""The invariant checker: what must hold after an episode, read from the records, never from the code.

Inputs are the database (business rows in the episode's schema, the ledger), the payment provider's
own records and the message history the model saw. The code's own counters (rollbacks, outcomes it
logged, the events table) are never read: a checker that trusts the code under test cannot catch it.
The scenario's :class:`agentlab.domains.billing.scenarios.Intended` says what the episode meant to do.

Violation kinds (:data:`KINDS`), each with one line on what it means:

=======================  =====================================================================
``duplicate_invoice``    more than one invoice for one customer and billing period
``negative_balance``     a customer's credit balance is below zero
``balance_mismatch``     a balance differs from its opening value minus the intended deductions
``record_count``         invoices, credit memos or refunds per customer differ from the intended
``payment_count``        charges or refunds at the provider per customer (after the outbox drained)
                         differ from the intended: an intent lost, or paid twice
``dangling_reference``   a credit memo names an invoice that does not exist
``applied_but_missing``  the model was told a record was created, and the database does not hold it
``unreported_effect``    the database holds a record the model was never told was created
``unanswered_call``      a tool call id with no ToolMessage or several, or an answer to no call
``leak``                 a ToolMessage shows SQL, internal identifiers, DSNs, hosts, secrets or a
                         stack trace (:func:`agentlab.core.errors.find_leaks`)
``ledger_mismatch``      (ledger on) a ledger row whose call the model was not told was applied, or
                         an applied call without its ledger row
``half_applied_batch``   (atomic policy) a batch whose answers mix applied and not applied calls
``cross_tenant_effect``  a row, payment intent, payment, balance change or answered read for a customer
                         of another tenant than the thread's (the tenant comes from the run's config,
                         never from the model): :func:`agentlab.lab.tenancy.cross_tenant_effects`
=======================  =====================================================================

A record's identity is its natural key (customer and billing period for an invoice, customer and
reference for a credit memo or refund); a tool call names it in its arguments.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from psycopg import sql

from agentlab.core.domain import Violation
from agentlab.core.errors import find_leaks
from agentlab.sim.model import classify
from agentlab.sim.provider import customer_ref
from agentlab.core.safeguards import Policy, Safeguards
from agentlab.domains.billing.errors import INTERNAL_IDENTIFIERS as BILLING_IDENTIFIERS
from agentlab.domains.billing.scenarios import Intended, Scenario
from agentlab.lab.tenancy import CrossTenantEffect, effect_counts_query, effects_from

KINDS: tuple[str, ...] = (
    "duplicate_invoice", "negative_balance", "balance_mismatch", "record_count", "payment_count",
    "dangling_reference", "applied_but_missing", "unreported_effect", "unanswered_call", "leak",
    "ledger_mismatch", "half_applied_batch", "cross_tenant_effect",
)

# The kinds in three groups: what the database and the provider hold; whether what the model was told
# matches what happened; the message history itself.
STATE_KINDS = ("duplicate_invoice", "negative_balance", "balance_mismatch", "record_count", "payment_count",
               "dangling_reference", "cross_tenant_effect")
REPORT_KINDS = ("applied_but_missing", "unreported_effect", "ledger_mismatch", "half_applied_batch")
MESSAGE_KINDS = ("unanswered_call", "leak")
assert set(STATE_KINDS + REPORT_KINDS + MESSAGE_KINDS) == set(KINDS)

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

_CREATES = {"CreateInvoice": ("invoice", "billing_period"), "CreateCreditMemo": ("credit_memo", "reference"),
            "QueueRefund": ("refund", "reference"), "RefundWithinCap": ("refund", "reference")}


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


async def read_records(pool, schema: str, customer_ids: list[int], thread_id: str | None = None
                       ) -> tuple[dict[int, CustomerRecords], set[str]]:
    """Each customer's rows in ``schema`` and payments in the provider's records, and the ledger's call
    ids for ``thread_id``, in one round trip."""
    query, params = records_query(schema, customer_ids, thread_id)
    async with pool.connection() as conn:
        return records_from(await (await conn.execute(query, params)).fetchone())


def records_query(schema: str, customer_ids: list[int], thread_id: str | None) -> tuple[sql.Composed, dict[str, Any]]:
    """The one statement :func:`read_records` sends, and its parameters (:func:`records_from` reads its row)."""
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


# --------------------------------------------------------------------------- message history

def _batches(messages: list) -> list[tuple[AIMessage, list[dict]]]:
    return [(m, list(m.tool_calls)) for m in messages if isinstance(m, AIMessage) and m.tool_calls]


def _answers(messages: list) -> dict[str, list[ToolMessage]]:
    out: dict[str, list[ToolMessage]] = {}
    for m in messages:
        if isinstance(m, ToolMessage):
            out.setdefault(m.tool_call_id, []).append(m)
    return out


def check_messages(messages: list, thread_id: str, safeguards: Safeguards | None = None,
                   identifiers: tuple[str, ...] = BILLING_IDENTIFIERS) -> list[Violation]:
    """The invariants the message history alone decides: unanswered calls, leaks (``identifiers``: the
    domain's internal names, ``domain.error_hints.identifiers``; billing's by default), half-applied batches."""
    out: list[Violation] = []
    answers = _answers(messages)
    call_ids = [tc["id"] for _, calls in _batches(messages) for tc in calls]
    for call_id in Counter(call_ids):
        got = len(answers.get(call_id, []))
        if got != 1:
            out.append(Violation("unanswered_call", thread_id, f"tool call {call_id} has {got} ToolMessages"))
    for call_id in answers.keys() - set(call_ids):
        out.append(Violation("unanswered_call", thread_id, f"a ToolMessage answers {call_id}, which no AIMessage sent"))
    for m in messages:
        if isinstance(m, ToolMessage):
            kinds = _leaks(str(m.content), tuple(identifiers))
            if kinds:
                out.append(Violation("leak", thread_id, f"{m.name} answer to {m.tool_call_id} shows {', '.join(kinds)}"))
    if safeguards is not None and safeguards.transaction and safeguards.policy is Policy.ATOMIC:
        for n, (_, calls) in enumerate(_batches(messages), 1):
            seen = [classify(answers[tc["id"]][0])[0] for tc in calls if answers.get(tc["id"])]
            ok = sum(k == "ok" for k in seen)
            if 0 < ok < len(seen):
                out.append(Violation("half_applied_batch", thread_id,
                                     f"batch {n}: {ok} of {len(seen)} calls reported applied under the atomic policy"))
    return out


@functools.lru_cache(maxsize=4096)
def _leaks(text: str, identifiers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(find_leaks(text, identifiers))  # answers repeat across episodes ("NOT APPLIED: ..."): scan each text once


def applied_calls(messages: list) -> list[dict]:
    """The tool calls whose ToolMessage reported them applied (as the model reads it)."""
    answers = _answers(messages)
    return [tc for _, calls in _batches(messages) for tc in calls
            if answers.get(tc["id"]) and classify(answers[tc["id"]][0])[0] == "ok"]


# --------------------------------------------------------------------------- the whole episode

async def check_episode(pool, ep, scenario: Scenario, safeguards: Safeguards, domain=None) -> list[Violation]:
    """Every violation of episode ``ep`` (an :class:`agentlab.runtime.harness.Episode`) of ``scenario``
    under ``safeguards``, from the database, the provider's records and ``ep.messages``.

    For billing (``domain`` None or billing) the checks below; for another domain the generic
    invariants (:func:`check_generic`) and the domain's own (``domain.invariants``)."""
    if domain is not None and domain.name != "billing":
        return await check_domain_episode(pool, ep, scenario, safeguards, domain)
    opening = {cid: spec.credit_cents for cid, spec in zip(ep.customer_ids, scenario.customers)}
    records_sql, records_params = records_query(ep.schema, ep.customer_ids, ep.thread_id)
    effects_sql, effects_params = effect_counts_query(ep.schema, ep.tenant_id, ep.customer_ids, messages=ep.messages)
    async with pool.connection() as conn:
        async with conn.pipeline():  # both statements, one round trip
            records_cur = await conn.execute(records_sql, records_params)
            effects_cur = await conn.execute(effects_sql, effects_params)
        records, ledger = records_from(await records_cur.fetchone())
        foreign = effects_from(await effects_cur.fetchall(), messages=ep.messages, opening_credit_cents=opening)
    return check_state(ep, scenario, safeguards, records, ledger if safeguards.ledger else None, foreign)


def check_state(ep, scenario: Scenario, safeguards: Safeguards, records: dict[int, CustomerRecords],
                ledger: set[str] | None, cross_tenant: Iterable[CrossTenantEffect] = ()) -> list[Violation]:
    """The checks of :func:`check_episode` on what was already read (pure; tests feed it broken states)."""
    tid = ep.thread_id
    out = check_messages(ep.messages, tid, safeguards)
    out += _state_checks(tid, ep.customer_ids, scenario, records)
    out += [Violation("cross_tenant_effect", tid, f"customer {e.customer_id} of tenant {e.customer_tenant} "
                      f"(thread tenant {ep.tenant_id}): {e.rows} {e.kind}" + (f", {e.detail}" if e.detail else ""))
            for e in cross_tenant]
    out += _effect_checks(tid, ep.customer_ids, ep.messages, records)
    if ledger is not None:
        applied = {tc["id"] for tc in applied_calls(ep.messages)}
        for call_id in sorted(ledger - applied):
            out.append(Violation("ledger_mismatch", tid, f"ledger row for {call_id}, not reported applied"))
        for call_id in sorted(applied - ledger):
            out.append(Violation("ledger_mismatch", tid, f"{call_id} reported applied, no ledger row"))
    return out


def _at(values: tuple[int, ...], pos: int) -> int | None:
    return values[pos] if pos < len(values) else None


def _state_checks(tid: str, ids: list[int], scenario: Scenario, records: dict[int, CustomerRecords]) -> list[Violation]:
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


def _key(tc: dict) -> tuple[str, str, str] | None:
    spec = _CREATES.get(tc.get("name"))
    args = tc.get("args")
    if spec is None or not isinstance(args, dict):
        return None
    return spec[0], str(args.get("customer_id")), str(args.get(spec[1]))


def _effect_checks(tid: str, ids: list[int], messages: list,
                   records: dict[int, CustomerRecords]) -> list[Violation]:
    out: list[Violation] = []
    mine = {str(i) for i in ids}  # records of customers outside the episode are not its to judge
    told = {k for k in (_key(tc) for tc in applied_calls(messages)) if k is not None and k[1] in mine}
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


def count_by_kind(violations: Iterable[Violation]) -> dict[str, int]:
    """``{kind: count}`` for every kind in :data:`KINDS` (zeros included), in that order."""
    counts = Counter(v.kind for v in violations)
    return {k: counts.get(k, 0) for k in KINDS}


# --------------------------------------------------------------------------- any domain

LEDGER_OF_THREAD = "SELECT tool_call_id FROM tool_executions WHERE thread_id = %s"
PAYMENTS_OF_THREAD = """
SELECT o.dedupe_key, o.status, (SELECT count(*) FROM provider.payments p WHERE p.reference = o.dedupe_key)
FROM outbox o WHERE o.thread_id = %s ORDER BY o.id
"""


async def check_generic(pool, ep, safeguards: Safeguards, identifiers: tuple[str, ...] = ()) -> list[Violation]:
    """The invariants every domain gets from what it declares: unanswered_call, leak and
    half_applied_batch (the message history), ledger_mismatch (the ledger against the calls reported
    applied, under the ledger), payment_count (each outbox intent of the thread paid exactly once at
    the provider once drained); ``identifiers``: the domain's internal names the leak check flags."""
    tid = ep.thread_id
    out = check_messages(ep.messages, tid, safeguards, identifiers)
    async with pool.connection() as conn:
        ledger = {r[0] for r in await (await conn.execute(LEDGER_OF_THREAD, (tid,))).fetchall()}
        payments = await (await conn.execute(PAYMENTS_OF_THREAD, (tid,))).fetchall()
    if safeguards.ledger:
        applied = {tc["id"] for tc in applied_calls(ep.messages)}
        out += [Violation("ledger_mismatch", tid, f"ledger row for {c}, not reported applied") for c in sorted(ledger - applied)]
        out += [Violation("ledger_mismatch", tid, f"{c} reported applied, no ledger row") for c in sorted(applied - ledger)]
    for key, status, paid in payments:
        if status == "dispatched" and paid != 1:
            out.append(Violation("payment_count", tid, f"intent {key}: {paid} payments at the provider, intended 1"))
    return out


async def check_domain_episode(pool, ep, scenario, safeguards: Safeguards, domain) -> list[Violation]:
    """:func:`check_generic` plus each of ``domain.invariants`` (read from the database).

    Raises:
        agentlab.core.errors.DomainError: an invariant raised (a domain bug, not a violation).
    """
    from agentlab.core.domain import InvariantContext
    from agentlab.core.errors import DomainError

    out = await check_generic(pool, ep, safeguards, domain.error_hints.identifiers)
    async with pool.connection() as conn:
        ctx = InvariantContext(conn, ep.thread_id, list(ep.customer_ids), ep.schema, scenario, list(ep.messages))
        for inv in domain.invariants:
            try:
                details = await inv.check(ctx)
            except Exception as exc:
                raise DomainError(f"domain {domain.name!r}: invariant {inv.kind!r} raised "
                                  f"{type(exc).__name__}: {exc}") from exc
            out += [Violation(inv.kind, ep.thread_id, d) for d in details]
    return out
