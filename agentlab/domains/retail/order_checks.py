"""Checks of the retail orders shared by the domain's invariants (:mod:`.domain`, on every order the change
log names) and the concurrency races (:mod:`.concurrency`, on one episode's own rows): each takes the SQL
of a SELECT of order ids and its parameters.
"""

from __future__ import annotations

# the order state machine: which status each may become through the tools (staying put is always allowed)
TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"cancelled", "pending (item modified)"}),
    "delivered": frozenset({"exchange requested", "return requested"}),
    "pending (item modified)": frozenset(),
    "processed": frozenset(),
    "cancelled": frozenset(),
    "exchange requested": frozenset(),
    "return requested": frozenset(),
}

REFUNDED_TWICE = """
SELECT order_id, payment_method_id,
       sum(amount_cents) FILTER (WHERE transaction_type = 'payment'),
       sum(amount_cents) FILTER (WHERE transaction_type = 'refund')
FROM retail.payment_history WHERE order_id IN ({orders})
GROUP BY 1, 2
HAVING sum(amount_cents) FILTER (WHERE transaction_type = 'refund')
       > sum(amount_cents) FILTER (WHERE transaction_type = 'payment')
ORDER BY 1, 2
"""
ORDER_MOVES = """
SELECT o.order_id, op.status, o.status, o.return_items IS NOT NULL, o.exchange_items IS NOT NULL,
       EXISTS (SELECT 1 FROM retail.order_items i JOIN retail.opening_order_items oi USING (order_id, position)
               WHERE i.order_id = o.order_id AND i.item_id <> oi.item_id),
       coalesce((SELECT sum(CASE h.transaction_type WHEN 'payment' THEN h.amount_cents ELSE -h.amount_cents END)
                 FROM retail.payment_history h WHERE h.order_id = o.order_id), 0),
       coalesce((SELECT sum(i.price_cents) FROM retail.order_items i WHERE i.order_id = o.order_id), 0)
FROM retail.orders o LEFT JOIN retail.opening_orders op USING (order_id)
WHERE o.order_id IN ({orders})
ORDER BY 1
"""


def amount_text(cents: int) -> str:
    """Cents as the text of an amount: 12345 -> "123.45"."""
    return f"{cents / 100:.2f}"


async def refunded_twice(conn, orders_sql: str, params: dict | None = None) -> list[str]:
    """The ``paid_twice`` details of the orders ``orders_sql`` selects (a SELECT of order ids, with ``params``):
    a payment method that paid on an order and was refunded more than it paid there. A method that paid
    nothing may receive a refund (tau2 refunds an item change's difference to any method of the user)."""
    rows = await (await conn.execute(REFUNDED_TWICE.format(orders=orders_sql), params or {})).fetchall()
    return [f"order {order_id}: {amount_text(refunded)} refunded to {pm}, which paid {amount_text(paid)} on it"
            for order_id, pm, paid, refunded in rows]


def order_fields(order_id: str, status: str, returned: bool, exchanged: bool, modified: bool) -> list[str]:
    """What an order's own fields say of its path through the state machine (each tool moves an order once):
    a return and an exchange on one order, or a cancelled order whose items were modified first."""
    out = []
    if returned and exchanged:
        out.append(f"order {order_id} ({status}) is both returned and exchanged")
    if status == "cancelled" and modified:
        out.append(f"order {order_id} is cancelled after its items were modified")
    return out
