"""Two conversations, one customer: billing's races for the concurrency family, their rows and invariants.

The lab's concurrency family (:mod:`agentlab.lab.concurrency`) runs two conversations at once on the same
rows and forces the interleaving that breaks a first draft; billing hands it these races as ``Domain.races``
(:data:`CONCURRENCY`, a :class:`agentlab.core.races.Races`). Each episode acts on a customer of its own, made
from the race's scenario (``redeem``: 5,000 cents of credit; ``capped_refund``: none) in the episode's schema:

========================  ================================================================================
fault                     the two conversations
========================  ================================================================================
``same_thread_runs``      one request (``RedeemCredit`` 2,000 of 5,000) submitted twice at once on *one*
                          thread (case C18, langgraph#8796)
``double_submit``         one refund (``RefundWithinCap`` 2,000, one reference) sent twice at once on two
                          threads (a double click, two support agents)
``lost_update``           two redemptions that both fit the credit (``RedeemCredit`` 2,000 and 1,500 of 5,000)
``check_then_act``        two redemptions that each fit alone, not together (3,000 and 3,000 of 5,000)
``write_skew``            two refunds under the daily cap that each fit alone (``RefundWithinCap`` 3,000 and
                          3,000 under a 5,000 cap, two references)
========================  ================================================================================

They meet at the act of their tool (:data:`MEETS_AT`): the balance ``UPDATE`` of a redemption, the refund
``INSERT`` of a refund; each race sends only one of the two.

The lab judges both conversations as one episode (``union``): billing's invariants
(:mod:`agentlab.domains.billing.invariants`) on both threads' effects against the end state both together
mean to reach (:attr:`Race.intended`), then the race's own (:func:`check_customers`, kinds :data:`KINDS`):

==================  ===================================================================================
``paid_twice``      one customer holds two refunds (or two payments at the provider) for one reference,
                    or two credit memos for one reference
``lost_update``     a balance differs from its opening value minus every redemption recorded against it
``cap_exceeded``    the day's refunds of a customer exceed the daily cap, or more credit was redeemed than
                    the customer had
==================  ===================================================================================

Sources: PostgreSQL docs "Transaction Isolation", "Explicit Locking", "Serializable Snapshot Isolation"
(wiki SSI; Ports and Grittner, VLDB 2012); Kingsbury, Jepsen analyses.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from psycopg import sql

from agentlab.core.domain import Violation
from agentlab.core.outbox import customer_ref
from agentlab.core.races import RaceEpisode, Races, forked_threads
from agentlab.core.scenario import C, PlannedCall
from agentlab.domains.billing.limits import DAILY_REFUND_CAP_CENTS, LIMIT_SCENARIOS, WRITE_CREDIT
from agentlab.domains.billing.scenarios import Intended, Scenario, create_customers
from agentlab.domains.billing.tools import CREATE_REFUND

KINDS: tuple[str, ...] = ("paid_twice", "lost_update", "cap_exceeded")
MEETS_AT = (WRITE_CREDIT, CREATE_REFUND)
"""The statements the two conversations meet at: a redemption's balance ``UPDATE``, a refund's ``INSERT``."""

Steps = tuple[tuple[PlannedCall, ...], ...]


@dataclass(frozen=True)
class Race:
    """One of billing's races: the calls of conversations A and B on the customer of a scenario.

    Attributes:
        fault: the family's fault it plays.
        scenario: the name of the scenario (:data:`agentlab.domains.billing.limits.LIMIT_SCENARIOS`) whose
            customer, prompt and tenant both conversations share; also the race's name.
        first, second: A's and B's planned calls, ``C(0)`` naming the episode's customer.
        intended: the end state both conversations together mean to reach.
    """

    fault: str
    scenario: str
    first: Steps
    second: Steps
    intended: Intended


def _redeem(amount: int) -> Steps:
    return ((PlannedCall("RedeemCredit", {"customer_id": C(0), "amount_cents": amount}),),)


def _capped(reference: str, amount: int) -> Steps:
    return ((PlannedCall("RefundWithinCap", {"customer_id": C(0), "reference": reference, "amount_cents": amount}),),)


_NO_RECORDS = {"invoices": (0,), "credit_memos": (0,), "provider_charges": (0,)}

RACES: dict[str, tuple[Race, ...]] = {r.fault: (r,) for r in (
    Race("same_thread_runs", "redeem", _redeem(2000), _redeem(2000),
         Intended(final_credit_cents=(3000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS)),
    Race("double_submit", "capped_refund", _capped("RMA-2001", 2000), _capped("RMA-2001", 2000),
         Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS)),
    Race("lost_update", "redeem", _redeem(2000), _redeem(1500),
         Intended(final_credit_cents=(1500,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS)),
    Race("check_then_act", "redeem", _redeem(3000), _redeem(3000),
         Intended(final_credit_cents=(2000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS)),
    Race("write_skew", "capped_refund", _capped("RMA-2001", 3000), _capped("RMA-2002", 3000),
         Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS)),
)}
"""Billing's race for each fault of the family (one each, named by its scenario)."""


@dataclass(frozen=True)
class RaceRows:
    """One episode's rows: its :class:`Race`, the scenario it starts from (clean), the schema its tools write
    to and its customers' ids (in the scenario's order)."""

    race: Race
    scenario: Scenario
    schema: str
    ids: list[int]


def race_of(fault: str, name: str) -> Race:
    """The race ``name`` of ``fault``. Raises ValueError naming billing's races for it."""
    for race in RACES.get(fault, ()):
        if race.scenario == name:
            return race
    raise ValueError(f"billing has no race {name!r} for fault {fault!r}; its races for it: "
                     f"{', '.join(r.scenario for r in RACES.get(fault, ())) or 'none'}")


async def create_rows(conn, episode: RaceEpisode) -> RaceRows:
    """The customers of ``episode``'s race scenario, new rows in ``episode.schema`` on ``conn`` (the kit's role,
    autocommit). Raises ValueError for a race billing does not have, psycopg errors as they come."""
    race = race_of(episode.fault, episode.race)
    scenario = LIMIT_SCENARIOS[race.scenario].clean()
    ids = await create_customers(conn, scenario.customers, episode.schema)
    return RaceRows(race, scenario, episode.schema, ids)


def scenarios(name: str, rows: RaceRows) -> tuple[Scenario, Scenario]:
    """Conversation A's and B's scenarios: the race's scenario with A's and B's steps; A's ``intended`` is the end
    state both together mean to reach. Pure."""
    a = dataclasses.replace(rows.scenario, steps=rows.race.first, intended=rows.race.intended)
    return a, dataclasses.replace(rows.scenario, steps=rows.race.second)


# --------------------------------------------------------------------------- invariants

CONCURRENCY_RECORDS = """
SELECT c.id, c.credit_cents,
       (SELECT coalesce(sum(r.amount_cents), 0) FROM limits.credit_redemptions r WHERE r.customer_id = c.id),
       (SELECT count(*) FROM limits.credit_redemptions r WHERE r.customer_id = c.id),
       (SELECT coalesce(json_agg(r.reference), '[]') FROM {s}.refunds r WHERE r.customer_id = c.id),
       (SELECT coalesce(json_agg(m.reference), '[]') FROM {s}.credit_memos m WHERE m.customer_id = c.id),
       (SELECT coalesce(max(d.total), 0) FROM (SELECT sum(r.amount_cents) AS total FROM {s}.refunds r
                                               WHERE r.customer_id = c.id GROUP BY r.created_at::date) d),
       (SELECT coalesce(json_agg(p.reference), '[]') FROM provider.payments p
         WHERE p.customer = %(prefix)s || c.id AND p.kind = 'refund')
FROM {s}.customers c WHERE c.id = ANY(%(ids)s)
"""


async def check_customers(conn, schema: str, customer_ids: list[int],
                          opening_cents: dict[int, int]) -> list[tuple[str, str]]:
    """The invariants of :data:`KINDS` for customers ``customer_ids`` in ``schema``, read on ``conn`` from the
    business tables and the provider's payments: ``[(kind, detail)]``, empty when they hold.

    ``opening_cents``: each customer's opening credit (cents), from the scenario."""
    prefix = customer_ref(0)[:-1]  # the provider names customer 7 "cus_7"
    query = sql.SQL(CONCURRENCY_RECORDS).format(s=sql.Identifier(schema))
    rows = await (await conn.execute(query, {"ids": customer_ids, "prefix": prefix})).fetchall()
    out: list[tuple[str, str]] = []
    for cid, credit, redeemed, n_redeemed, refunds, memos, day_max, paid in rows:
        for what, refs in (("refunds", refunds), ("credit memos", memos), ("provider refunds", paid)):
            for ref, n in Counter(refs).items():
                if n > 1:
                    out.append(("paid_twice", f"customer {cid}: {n} {what} for reference {ref}"))
        opening = opening_cents.get(cid)
        if n_redeemed and opening is not None and credit != opening - redeemed:
            out.append(("lost_update", f"customer {cid}: balance {credit} cents, opening {opening} minus "
                                       f"{n_redeemed} redemption(s) of {redeemed} is {opening - redeemed}"))
        if opening is not None and redeemed > opening:
            out.append(("cap_exceeded", f"customer {cid}: {redeemed} cents redeemed of {opening}"))
        if day_max > DAILY_REFUND_CAP_CENTS:
            out.append(("cap_exceeded", f"customer {cid}: {day_max} cents refunded in one day, "
                                        f"cap {DAILY_REFUND_CAP_CENTS}"))
    return out


async def check_rows(conn, rows: RaceRows) -> list[tuple[str, str]]:
    """:func:`check_customers` on one episode's rows, against its scenario's opening credit."""
    opening = {cid: spec.credit_cents for cid, spec in zip(rows.ids, rows.scenario.customers)}
    return await check_customers(conn, rows.schema, rows.ids, opening)


async def check_concurrency(pool, schema: str, customer_ids: list[int], opening_cents: dict[int, int],
                            thread_ids: list[str]) -> list[Violation]:
    """:func:`check_customers` and ``forked_thread`` (:func:`agentlab.core.races.forked_threads`) for customers
    ``customer_ids`` in ``schema`` and threads ``thread_ids``, on one connection of ``pool``; the customers'
    violations are the first thread's."""
    async with pool.connection() as conn:
        found = await check_customers(conn, schema, customer_ids, opening_cents)
        forked = await forked_threads(conn, thread_ids)
    return ([Violation(kind, thread_ids[0], detail) for kind, detail in found]
            + [Violation("forked_thread", thread, detail) for thread, detail in forked])


CONCURRENCY = Races(
    by_fault={fault: tuple(r.scenario for r in races) for fault, races in RACES.items()},
    create=create_rows, scenarios=scenarios, check=check_rows, acts=MEETS_AT, kinds=KINDS,
    ids=lambda rows: list(rows.ids), union=True,
)
"""Billing's races as the lab plays them (``Domain.races``, :class:`agentlab.core.races.Races`)."""
