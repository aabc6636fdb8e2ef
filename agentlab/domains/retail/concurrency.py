"""Two conversations, one order: the concurrency fault family on tau2 retail, its rows and invariants.

Each episode of a fault of real concurrency (:mod:`agentlab.lab.concurrency`) acts on rows of its own,
made by :func:`create_entities` (so that episodes running at once on one chaos database never share a
row, and the invariants read only the episode's own): a user, two gift cards (``G1`` 500.00, ``G2``
200.00) and three orders of one item each, every one paid in full by ``G1`` (``P1`` and ``P2`` pending,
``D`` delivered). The rows are also written to the opening snapshot (``retail.opening_*``), so the
domain's own invariants see them as part of the opening state.

The races (:data:`RACES`, per fault; an episode plays one, chosen by its seed):

=====================  ==========================================================================================
fault                  the two conversations
=====================  ==========================================================================================
``same_thread_runs``   one ``cancel_pending_order`` of ``P1`` submitted twice at once on *one* thread
``double_submit``      one ``modify_pending_order_payment`` of ``P1`` (``G1`` to ``G2``) sent twice, two threads
``lost_update``        ``cancel_pending_order`` of ``P1`` and of ``P2``: two refunds to ``G1``, two orders
``check_then_act``     two cancels of ``P1`` (two agents, two reasons); or ``modify_pending_order_items`` and a
                       cancel of ``P1``; or a return and an exchange of ``D`` (one per delivered order)
``write_skew``         not applicable: tau2 retail has no limit shared by rows that two tools insert or
                       update apart (no refund cap, no stock count; the gift card's balance is one row)
=====================  ==========================================================================================

What goes wrong without a safeguard: each tool checks the order's status and reads the gift card's
balance, then acts; the balance is written as an absolute value (:data:`.queries.SET_BALANCE`). At READ
COMMITTED with plain reads (``row_locks`` off) both conversations pass the check on the same snapshot of
the row: a pending order is cancelled and refunded twice, a delivered one is both returned and exchanged,
and the second balance written overwrites the first. ``row_locks`` (``SELECT ... FOR UPDATE`` on the
order, then the payment methods) makes the second wait and then see the first one's result; ``repeatable
read`` makes the late writer fail with 40001 (retried by the graph: the retry reads the new state).

Invariants (:func:`check_entities`, read from the database; kinds :data:`KINDS`: ``paid_twice``
(:func:`.domain.paid_twice`) and the names of the domain's own invariants, which check the same on every
order the change log names):

===========================  ===============================================================================
``paid_twice``               a payment method that paid on an order was refunded more than it paid there (one
                             payment refunded twice)
``gift_card_balance``        a gift card's balance differs from its opening balance + the refunds - the
                             payments recorded on it since (a lost update)
``order_status_transition``  an order left the state machine (:data:`.order_checks.TRANSITIONS`): a status its
                             opening status cannot reach, a return and an exchange on one order, a cancelled
                             order whose items were modified first
``order_payments``           a cancelled order whose payment history does not net to zero, or another whose
                             payments do not net to the price of its items
===========================  ===============================================================================

Sources: PostgreSQL docs "Transaction Isolation" (13.2), "Explicit Locking" (13.3); tau2-bench's retail
tools (each reads the order's status, then acts).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from agentlab.core.races import Races
from agentlab.core.scenario import PlannedCall, Scenario
from agentlab.domains.retail.order_checks import (
    ORDER_MOVES,
    TRANSITIONS,
    amount_text,
    order_fields,
    refunded_twice,
)
from agentlab.domains.retail.queries import ACTS

TENANT = "tau2"
G1_OPENING_CENTS = 50_000
G2_OPENING_CENTS = 20_000
KINDS: tuple[str, ...] = ("paid_twice", "gift_card_balance", "order_status_transition", "order_payments")
NOT_APPLICABLE = {
    "write_skew": "tau2 retail has no limit shared by rows that two tools write apart (no refund cap, no stock "
                  "count; a gift card's balance is one row: a lost update, not write skew)",
}


@dataclass(frozen=True)
class Entities:
    """The rows of one episode: ids of the user, the gift cards, the orders, and the item exchange offered."""

    key: str
    user_id: str
    g1: str
    g2: str
    p1: str
    p2: str
    delivered: str
    item_id: str  # the item each order holds
    new_item_id: str  # a dearer available variant of the same product
    item_price_cents: int
    new_item_price_cents: int


# a product with an available variant and a dearer available variant of the same product (tau2's data)
TEMPLATE_ITEM = """
SELECT v.product_id, p.name, v.item_id, v.price_cents, v.options, w.item_id, w.price_cents
FROM retail.variants v JOIN retail.products p USING (product_id)
JOIN retail.variants w ON w.product_id = v.product_id AND w.item_id <> v.item_id AND w.available
                       AND w.price_cents > v.price_cents
WHERE v.available AND v.price_cents < %s AND w.price_cents - v.price_cents < %s
ORDER BY p.position, v.position, w.position LIMIT 1
"""
NEXT_POSITIONS = """
SELECT (SELECT coalesce(max(position), -1) + 1 FROM retail.users),
       (SELECT coalesce(max(position), -1) + 1 FROM retail.orders)
"""
INSERT_USER = """
INSERT INTO retail.users (user_id, position, first_name, last_name, address1, address2, city, country, state, zip,
                          email)
VALUES (%s, %s, 'Riley', 'Race', '1 Main Street', '', 'Springfield', 'USA', 'IL', '62701', %s)
"""
INSERT_GIFT_CARD = """
INSERT INTO retail.payment_methods (payment_method_id, user_id, position, source, balance_cents)
VALUES (%s, %s, %s, 'gift_card', %s)
"""
INSERT_ORDER = """
INSERT INTO retail.orders (order_id, position, user_id, user_position, address1, address2, city, country, state, zip,
                           status)
VALUES (%s, %s, %s, %s, '1 Main Street', '', 'Springfield', 'USA', 'IL', '62701', %s)
"""
INSERT_ITEM = """
INSERT INTO retail.order_items (order_id, position, item_id, product_id, name, price_cents, options)
VALUES (%s, 0, %s, %s, %s, %s, %s)
"""
INSERT_PAYMENT = """
INSERT INTO retail.payment_history (order_id, seq, user_id, transaction_type, amount_cents, payment_method_id)
VALUES (%s, 0, %s, 'payment', %s, %s)
"""
SNAPSHOT = (
    ("INSERT INTO retail.opening_gift_cards SELECT payment_method_id, balance_cents FROM retail.payment_methods "
     "WHERE user_id = %(u)s AND source = 'gift_card'"),
    ("INSERT INTO retail.opening_orders SELECT o.order_id, o.status, (SELECT count(*) FROM retail.payment_history h "
     "WHERE h.order_id = o.order_id) FROM retail.orders o WHERE o.user_id = %(u)s"),
    ("INSERT INTO retail.opening_order_items SELECT i.order_id, i.position, i.item_id, i.price_cents, i.options "
     "FROM retail.order_items i JOIN retail.orders o USING (order_id) WHERE o.user_id = %(u)s"),
)
POSITIONS_LOCK = 7_300_013  # pg_advisory_xact_lock key: one episode at a time picks the next positions


async def create_entities(conn, key: str | None = None) -> Entities:
    """Insert one episode's rows (see the module docstring) on ``conn`` (a superuser connection of the kit's
    database, autocommit), in one transaction, and snapshot them as opening state. ``key``: the ids' suffix
    (a new one when None). Raises psycopg errors as they come (a database without the retail schema)."""
    from psycopg.types.json import Jsonb

    key = key or uuid.uuid4().hex[:10]
    async with conn.transaction():
        row = await (await conn.execute(TEMPLATE_ITEM, (G2_OPENING_CENTS // 2, G1_OPENING_CENTS // 4))).fetchone()
        if row is None:
            raise LookupError("the retail data has no product with two available variants of different prices")
        product_id, name, item_id, price, options, new_item_id, new_price = row
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (POSITIONS_LOCK,))
        user_pos, order_pos = await (await conn.execute(NEXT_POSITIONS)).fetchone()
        e = Entities(key, f"race_{key}", f"gift_card_g1{key}", f"gift_card_g2{key}", f"#R{key}p1", f"#R{key}p2",
                     f"#R{key}d", item_id, new_item_id, price, new_price)
        await conn.execute(INSERT_USER, (e.user_id, user_pos, f"{e.user_id}@example.com"))
        await conn.execute(INSERT_GIFT_CARD, (e.g1, e.user_id, 0, G1_OPENING_CENTS))
        await conn.execute(INSERT_GIFT_CARD, (e.g2, e.user_id, 1, G2_OPENING_CENTS))
        for n, (order_id, status) in enumerate(((e.p1, "pending"), (e.p2, "pending"), (e.delivered, "delivered"))):
            await conn.execute(INSERT_ORDER, (order_id, order_pos + n, e.user_id, n, status))
            await conn.execute(INSERT_ITEM, (order_id, item_id, product_id, name, price, Jsonb(options)))
            await conn.execute(INSERT_PAYMENT, (order_id, e.user_id, price, e.g1))
        for query in SNAPSHOT:
            await conn.execute(query, {"u": e.user_id})
    return e


# --------------------------------------------------------------------------- the races

def _cancel(order_id: str, reason: str = "no longer needed") -> PlannedCall:
    return PlannedCall("cancel_pending_order", {"order_id": order_id, "reason": reason})


@dataclass(frozen=True)
class Race:
    """Two conversations' calls on an episode's :class:`Entities`: ``calls(e) -> (A's call, B's call)``."""

    name: str
    fault: str
    title: str
    calls: object  # Callable[[Entities], tuple[PlannedCall, PlannedCall]]

    def scenarios(self, e: Entities) -> tuple[Scenario, Scenario]:
        """Conversation A's and B's scenarios: one step of one call each, on ``e``'s rows."""
        a, b = self.calls(e)
        base = Scenario(f"retail_{self.name}", self.title, self.title, customers=(), steps=((a,),),
                        intended={"race": self.name, "user_id": e.user_id}, tenant_id=TENANT)
        return base, dataclasses.replace(base, steps=((b,),))


RACES: dict[str, tuple[Race, ...]] = {
    "same_thread_runs": (
        Race("cancel_twice_one_thread", "same_thread_runs", "Cancel pending order P1, submitted twice on one thread",
             lambda e: (_cancel(e.p1), _cancel(e.p1))),
    ),
    "double_submit": (
        Race("payment_change_twice", "double_submit", "Pay pending order P1 with gift card G2 instead of G1, "
             "sent twice from two threads", lambda e: (
                 PlannedCall("modify_pending_order_payment", {"order_id": e.p1, "payment_method_id": e.g2}),
                 PlannedCall("modify_pending_order_payment", {"order_id": e.p1, "payment_method_id": e.g2}))),
    ),
    "lost_update": (
        Race("two_refunds_one_gift_card", "lost_update", "Cancel pending orders P1 and P2, both refunded to G1",
             lambda e: (_cancel(e.p1), _cancel(e.p2))),
    ),
    "check_then_act": (
        Race("two_cancels", "check_then_act", "Two agents cancel pending order P1 at once",
             lambda e: (_cancel(e.p1, "no longer needed"), _cancel(e.p1, "ordered by mistake"))),
        Race("exchange_and_cancel", "check_then_act", "Change P1's item for a dearer one while P1 is cancelled",
             lambda e: (PlannedCall("modify_pending_order_items", {"order_id": e.p1, "item_ids": [e.item_id],
                                                                   "new_item_ids": [e.new_item_id],
                                                                   "payment_method_id": e.g1}),
                        _cancel(e.p1))),
        Race("return_and_exchange", "check_then_act", "Return delivered order D while it is exchanged",
             lambda e: (PlannedCall("return_delivered_order_items", {"order_id": e.delivered, "item_ids": [e.item_id],
                                                                     "payment_method_id": e.g1}),
                        PlannedCall("exchange_delivered_order_items", {"order_id": e.delivered,
                                                                       "item_ids": [e.item_id],
                                                                       "new_item_ids": [e.new_item_id],
                                                                       "payment_method_id": e.g1}))),
    ),
}
"""The races of each fault of the concurrency family that fits retail (``write_skew`` does not:
:data:`NOT_APPLICABLE`)."""
BY_NAME: dict[str, Race] = {r.name: r for races in RACES.values() for r in races}
MEETS_AT = ACTS
"""The statements the two conversations meet at: each write tool's first write (:data:`.queries.ACTS`)."""


# --------------------------------------------------------------------------- invariants

USER_ORDERS = "SELECT order_id FROM retail.orders WHERE user_id = ANY(%(users)s)"
BALANCES = f"""
SELECT p.payment_method_id, g.balance_cents, p.balance_cents,
       coalesce((SELECT sum(CASE h.transaction_type WHEN 'refund' THEN h.amount_cents ELSE -h.amount_cents END)
                 FROM retail.payment_history h JOIN retail.opening_orders o USING (order_id)
                 WHERE h.payment_method_id = p.payment_method_id AND h.seq >= o.payments
                   AND h.order_id IN ({USER_ORDERS})), 0)
FROM retail.payment_methods p JOIN retail.opening_gift_cards g USING (payment_method_id)
WHERE p.user_id = ANY(%(users)s)
ORDER BY 1
"""
async def check_entities(conn, user_ids: list[str]) -> list[tuple[str, str]]:
    """The invariants of :data:`KINDS` on the orders and gift cards of ``user_ids``, read on ``conn``:
    ``[(kind, detail)]``, empty when they hold. The same checks as the domain's invariants of those names
    (:data:`agentlab.domains.retail.domain.INVARIANTS`, and :func:`~agentlab.domains.retail.domain.paid_twice`),
    on these users' rows alone."""
    params = {"users": list(user_ids)}
    out: list[tuple[str, str]] = [("paid_twice", d) for d in await refunded_twice(conn, USER_ORDERS, params)]
    for pm, opening, have, net in await (await conn.execute(BALANCES, params)).fetchall():
        if have != opening + net:
            detail = (f"gift card {pm}: balance {amount_text(have)}, opening {amount_text(opening)} + recorded {amount_text(net)} = "
                      f"{amount_text(opening + net)}")
            out.append(("gift_card_balance", detail))
    for order_id, was, status, returned, exchanged, modified, net, items in await (
            await conn.execute(ORDER_MOVES.format(orders=USER_ORDERS), params)).fetchall():
        if was is not None and status != was and status not in TRANSITIONS.get(was, ()):
            detail = f"order {order_id}: status {was!r} -> {status!r} is not a transition of the order state machine"
            out.append(("order_status_transition", detail))
        out += [("order_status_transition", d) for d in order_fields(order_id, status, returned, exchanged, modified)]
        if status == "cancelled" and net != 0:
            out.append(("order_payments", f"order {order_id} is cancelled but its payment history nets {amount_text(net)}"))
        elif status != "cancelled" and net != items:
            detail = f"order {order_id} ({status}): payments net {amount_text(net)}, its items cost {amount_text(items)}"
            out.append(("order_payments", detail))
    return out


async def check_rows(conn, e: Entities) -> list[tuple[str, str]]:
    """:func:`check_entities` on the user of one episode's rows ``e``."""
    return await check_entities(conn, [e.user_id])


CONCURRENCY = Races(
    by_fault={fault: tuple(r.name for r in races) for fault, races in RACES.items()},
    create=lambda conn, episode: create_entities(conn), scenarios=lambda race, e: BY_NAME[race].scenarios(e),
    check=check_rows, acts=MEETS_AT,
    not_applicable=NOT_APPLICABLE, kinds=KINDS, notes=lambda e: {"user_id": e.user_id},
)
"""Retail's races as the lab plays them (``Domain.races``, :class:`agentlab.core.races.Races`)."""
