"""The invariant checker: what must hold after an episode, read from the records, never from the code.

Inputs are the database (business rows in the episode's schema, the ledger), the payment provider's
own records and the message history the model saw. The code's own counters (rollbacks, outcomes it
logged, the events table) are never read: a checker that trusts the code under test cannot catch it.

Every domain is checked the same way (:func:`check_episode`): the generic kinds below, which the message
history, the ledger and the outbox decide, then the domain's own ``invariants``
(:class:`agentlab.core.domain.Invariant`); a domain's invariant of a generic kind replaces the generic
check. Billing's nine kinds (records, balances, payments per customer, other tenants' customers) are one
domain's invariants like any other's, tabled in :mod:`agentlab.domains.billing.invariants`; :data:`KINDS`
lists them with the generic ones because the lab's tables and charts show billing by default.

=======================  =====================================================================
``unanswered_call``      a tool call id with no ToolMessage or several, or an answer to no call
``leak``                 a ToolMessage shows SQL, internal identifiers, DSNs, hosts, secrets or a
                         stack trace (:func:`agentlab.core.leaks.find_leaks`)
``half_applied_batch``   (atomic policy) a batch whose answers mix applied and not applied calls
``ledger_mismatch``      (ledger on) a ledger row whose call the model was not told was applied, or
                         an applied call without its ledger row
``payment_count``        an outbox intent of the thread, dispatched, paid other than once at the provider
=======================  =====================================================================
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable

from langchain_core.messages import AIMessage, ToolMessage

from agentlab.core.domain import Violation
from agentlab.core.leaks import find_leaks
from agentlab.core.safeguards import Policy, Safeguards
from agentlab.domains.billing import invariants as billing
from agentlab.domains.billing.errors import INTERNAL_IDENTIFIERS as BILLING_IDENTIFIERS
from agentlab.domains.billing.invariants import (  # noqa: F401 (their home moved; these names stay)
    CUSTOMER_RECORDS,
    EPISODE_RECORDS,
    CustomerRecords,
    records_from,
    records_query,
)
from agentlab.domains.billing.scenarios import Scenario
from agentlab.domains.billing.tenancy import CrossTenantEffect
from agentlab.sim.model import classify

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

async def check_episode(pool, ep, scenario, safeguards: Safeguards, domain=None) -> list[Violation]:
    """Every violation of episode ``ep`` (an :class:`agentlab.runtime.harness.Episode`) of ``scenario``
    under ``safeguards``, read from the database, the provider's records and ``ep.messages``, for any
    ``domain`` (a :class:`agentlab.core.domain.Domain`; None: the default, billing) the same way.

    In this order: the message history (:func:`check_messages`), the domain's own invariants
    (``domain.invariants``, in its order), then the generic record checks (:func:`check_records`) whose
    kinds the domain does not check itself.

    Raises:
        agentlab.core.errors.DomainError: an invariant raised (a domain bug, not a violation).
    """
    from agentlab.runtime.domains import resolve_domain

    domain = resolve_domain(domain)
    out = check_messages(ep.messages, ep.thread_id, safeguards, domain.error_hints.identifiers)
    out += await check_invariants(pool, ep, scenario, domain)
    out += await check_records(pool, ep, safeguards, skip={inv.kind for inv in domain.invariants})
    return out


async def check_invariants(pool, ep, scenario, domain) -> list[Violation]:
    """Each of ``domain.invariants`` on episode ``ep``, on one connection of ``pool``.

    Raises:
        agentlab.core.errors.DomainError: an invariant raised (a domain bug, not a violation).
    """
    from agentlab.core.domain import InvariantContext
    from agentlab.core.errors import DomainError

    out: list[Violation] = []
    if not domain.invariants:
        return out
    async with pool.connection() as conn:
        ctx = InvariantContext(conn, ep.thread_id, list(ep.customer_ids), ep.schema, scenario, list(ep.messages),
                               applied=applied_calls(ep.messages), tenant_id=ep.tenant_id)
        for inv in domain.invariants:
            try:
                details = await inv.check(ctx)
            except Exception as exc:
                raise DomainError(f"domain {domain.name!r}: invariant {inv.kind!r} raised "
                                  f"{type(exc).__name__}: {exc}") from exc
            out += [Violation(inv.kind, ep.thread_id, d) for d in details]
    return out


def check_state(ep, scenario: Scenario, safeguards: Safeguards, records: dict[int, CustomerRecords],
                ledger: set[str] | None, cross_tenant: Iterable[CrossTenantEffect] = ()) -> list[Violation]:
    """Billing's checks of :func:`check_episode` on what was already read (pure; tests and the concurrency
    loops, which read several threads' records at once, feed it states): the message history, billing's
    invariants (:mod:`agentlab.domains.billing.invariants`) and, when ``ledger`` is given, the ledger."""
    tid = ep.thread_id
    out = check_messages(ep.messages, tid, safeguards)
    out += billing.state_violations(tid, ep.customer_ids, scenario, records)
    out += billing.cross_tenant_violations(tid, ep.tenant_id, cross_tenant)
    out += billing.effect_violations(tid, ep.customer_ids, applied_calls(ep.messages), records)
    if ledger is not None:
        out += _ledger_violations(tid, ep.messages, ledger)
    return out


def _ledger_violations(tid: str, messages: list, ledger: set[str]) -> list[Violation]:
    applied = {tc["id"] for tc in applied_calls(messages)}
    return ([Violation("ledger_mismatch", tid, f"ledger row for {c}, not reported applied") for c in sorted(ledger - applied)]
            + [Violation("ledger_mismatch", tid, f"{c} reported applied, no ledger row") for c in sorted(applied - ledger)])


async def read_records(pool, schema: str, customer_ids: list[int], thread_id: str | None = None
                       ) -> tuple[dict[int, CustomerRecords], set[str]]:
    """Billing: each customer's rows in ``schema`` and payments in the provider's records, and the ledger's
    call ids for ``thread_id``, in one round trip (:func:`agentlab.domains.billing.invariants.records_query`)."""
    query, params = records_query(schema, customer_ids, thread_id)
    async with pool.connection() as conn:
        return records_from(await (await conn.execute(query, params)).fetchone())


def count_by_kind(violations: Iterable[Violation]) -> dict[str, int]:
    """``{kind: count}`` for every kind in :data:`KINDS` (zeros included), in that order."""
    counts = Counter(v.kind for v in violations)
    return {k: counts.get(k, 0) for k in KINDS}


# --------------------------------------------------------------------------- any domain

LEDGER_OF_THREADS = "SELECT tool_call_id FROM tool_executions WHERE thread_id = ANY(%s)"
PAYMENTS_OF_THREADS = """
SELECT o.dedupe_key, o.status, (SELECT count(*) FROM provider.payments p WHERE p.reference = o.dedupe_key)
FROM outbox o WHERE o.thread_id = ANY(%s) ORDER BY o.id
"""


async def check_generic(pool, ep, safeguards: Safeguards, identifiers: tuple[str, ...] = ()) -> list[Violation]:
    """The invariants every domain gets from what it declares: :func:`check_messages` (``identifiers``: the
    domain's internal names the leak check flags) and :func:`check_records`."""
    return check_messages(ep.messages, ep.thread_id, safeguards, identifiers) + await check_records(pool, ep, safeguards)


async def check_records(pool, ep, safeguards: Safeguards, skip: Iterable[str] = (),
                        threads: Iterable[str] | None = None) -> list[Violation]:
    """The generic record checks, each unless its kind is in ``skip`` (a domain checking it itself):
    ledger_mismatch (the ledger against the calls reported applied, under the ledger) and payment_count
    (each outbox intent of the thread paid exactly once at the provider once drained). ``threads``: the
    threads whose ledger rows and outbox intents count (None: ``ep.thread_id``'s; the two conversations of a
    race judged as one episode pass both, their calls in ``ep.messages``); violations are ``ep.thread_id``'s."""
    skip = set(skip)
    tid, out = ep.thread_id, []
    tids = [tid] if threads is None else list(dict.fromkeys(threads))
    wants_ledger = safeguards.ledger and "ledger_mismatch" not in skip
    if not wants_ledger and "payment_count" in skip:
        return out
    async with pool.connection() as conn:
        ledger = {r[0] for r in await (await conn.execute(LEDGER_OF_THREADS, (tids,))).fetchall()}
        payments = await (await conn.execute(PAYMENTS_OF_THREADS, (tids,))).fetchall()
    if wants_ledger:
        out += _ledger_violations(tid, ep.messages, ledger)
    if "payment_count" not in skip:
        for key, status, paid in payments:
            if status == "dispatched" and paid != 1:
                out.append(Violation("payment_count", tid, f"intent {key}: {paid} payments at the provider, intended 1"))
    return out


check_domain_episode = check_episode  # the name this had while billing was checked apart
