"""The retail tools' statements and the reads and locks their handlers share
(:mod:`agentlab.domains.retail.read_tools`, :mod:`agentlab.domains.retail.write_tools`): an order, its
items, a user's payment methods, a variant, each read plain or locked as the preset's locking asks.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from agentlab.core.errors import NotFound

ORDER_READ = "SELECT user_id, status FROM retail.orders WHERE order_id = %s"
ORDER_FOR_UPDATE = ORDER_READ + " FOR UPDATE"
ORDER_ITEMS_READ = ("SELECT position, item_id, product_id, price_cents, options FROM retail.order_items "
                    "WHERE order_id = %s ORDER BY position")
ORDER_ITEMS_FOR_UPDATE = ORDER_ITEMS_READ + " FOR UPDATE"
ORDER_ITEM_IDS = "SELECT item_id, product_id, price_cents FROM retail.order_items WHERE order_id = %s ORDER BY position"
PAYMENTS = ("SELECT seq, transaction_type, amount_cents, payment_method_id FROM retail.payment_history "
            "WHERE order_id = %s ORDER BY seq")
INSERT_PAYMENT = ("INSERT INTO retail.payment_history (order_id, seq, user_id, transaction_type, amount_cents, "
                  "payment_method_id) VALUES (%s, %s, %s, %s, %s, %s)")
VARIANT_READ = "SELECT available, price_cents, options FROM retail.variants WHERE product_id = %s AND item_id = %s"
VARIANT_FOR_SHARE = VARIANT_READ + " FOR SHARE"
PRODUCT_EXISTS = "SELECT 1 FROM retail.products WHERE product_id = %s"
PAYMENT_METHOD = ("SELECT source, balance_cents FROM retail.payment_methods "
                  "WHERE user_id = %s AND payment_method_id = %s")
PAYMENT_METHODS_READ = ("SELECT payment_method_id, source, balance_cents FROM retail.payment_methods "
                        "WHERE user_id = %s AND payment_method_id = ANY(%s) ORDER BY payment_method_id")
PAYMENT_METHODS_FOR_UPDATE = PAYMENT_METHODS_READ + " FOR UPDATE"
SET_BALANCE = ("UPDATE retail.payment_methods SET balance_cents = %s "
               "WHERE payment_method_id = %s AND source = 'gift_card'")
NEXT_SEQ = "SELECT coalesce(max(seq), -1) + 1 FROM retail.payment_history WHERE order_id = %s"
SET_STATUS_CANCELLED = "UPDATE retail.orders SET status = 'cancelled', cancel_reason = %s WHERE order_id = %s"
SET_STATUS_EXCHANGE = (
    "UPDATE retail.orders SET status = 'exchange requested', exchange_items = %s, exchange_new_items = %s, "
    "exchange_payment_method_id = %s, exchange_price_difference_cents = %s WHERE order_id = %s")
SET_STATUS_RETURN = ("UPDATE retail.orders SET status = 'return requested', return_items = %s, "
                     "return_payment_method_id = %s WHERE order_id = %s")
SET_STATUS_ITEM_MODIFIED = "UPDATE retail.orders SET status = 'pending (item modified)' WHERE order_id = %s"
USER_READ = "SELECT 1 FROM retail.users WHERE user_id = %s"
USER_FOR_UPDATE = USER_READ + " FOR UPDATE"
ACTS = (SET_BALANCE, NEXT_SEQ, SET_STATUS_CANCELLED, SET_STATUS_EXCHANGE, SET_STATUS_RETURN, SET_STATUS_ITEM_MODIFIED)
"""Each write tool's first write (or the read that numbers its payment rows) goes through one of these:
where two racing conversations meet (:mod:`agentlab.lab.concurrency`)."""
SET_ORDER_ADDRESS = ("UPDATE retail.orders SET address1 = %s, address2 = %s, city = %s, state = %s, country = %s, "
                     "zip = %s WHERE order_id = %s")
SET_USER_ADDRESS = ("UPDATE retail.users SET address1 = %s, address2 = %s, city = %s, state = %s, country = %s, "
                    "zip = %s WHERE user_id = %s")


async def fetch_one(conn: psycopg.AsyncConnection, query: str, params: tuple) -> tuple | None:
    cur = await conn.execute(query, params)
    return await cur.fetchone()


async def fetch_all(conn: psycopg.AsyncConnection, query: str, params: tuple) -> list[tuple]:
    cur = await conn.execute(query, params)
    return await cur.fetchall()


def locking(ctx) -> bool:
    """Whether the tools lock what they check (``ctx.safeguards.row_locks``; True when ``ctx`` has none)."""
    sg = getattr(ctx, "safeguards", None)
    return True if sg is None else bool(getattr(sg, "row_locks", True))


async def lock_order(conn, order_id: str, ctx=None) -> tuple[str, str]:
    """``(user_id, status)`` of the order, its row locked ``FOR UPDATE`` (a plain read without row locks);
    NotFound when it does not exist."""
    row = await fetch_one(conn, ORDER_FOR_UPDATE if locking(ctx) else ORDER_READ, (order_id,))
    if row is None:
        raise NotFound("Order not found")
    return row


async def lock_payment_methods(conn, user_id: str, ids, ctx=None) -> dict[str, tuple[str, int | None]]:
    """The user's payment methods among ``ids``, locked ``FOR UPDATE`` in id order (a plain read without
    row locks): id -> (source, balance)."""
    query = PAYMENT_METHODS_FOR_UPDATE if locking(ctx) else PAYMENT_METHODS_READ
    rows = await fetch_all(conn, query, (user_id, sorted(set(ids))))
    return {pm_id: (source, balance) for pm_id, source, balance in rows}


async def payment_method(conn, user_id: str, pm_id: str, *, lock: bool, ctx=None) -> tuple[str, int | None]:
    """``(source, balance_cents)`` of the user's payment method; NotFound when the user has no such method."""
    if lock:
        found = (await lock_payment_methods(conn, user_id, [pm_id], ctx)).get(pm_id)
    else:
        found = await fetch_one(conn, PAYMENT_METHOD, (user_id, pm_id))
    if found is None:
        raise NotFound("Payment method not found")
    return tuple(found)


async def variant(conn, product_id: str, item_id: str, ctx=None) -> tuple[bool, int, dict]:
    """``(available, price_cents, options)`` of the product's variant, ``FOR SHARE`` (a plain read without row
    locks); tau2's _get_variant."""
    row = await fetch_one(conn, VARIANT_FOR_SHARE if locking(ctx) else VARIANT_READ, (product_id, item_id))
    if row is None:
        if await fetch_one(conn, PRODUCT_EXISTS, (product_id,)) is None:
            raise NotFound("Product not found")
        raise NotFound("Variant not found")
    return row


def count_check(item_ids: list[str], order_item_ids: list[str], message: Callable[[str], str]) -> None:
    """tau2's check that each id is asked for at most as many times as the order holds it."""
    for item_id in item_ids:
        if item_ids.count(item_id) > order_item_ids.count(item_id):
            raise NotFound(message(item_id))


async def append_payments(conn, order_id: str, user_id: str, entries: list[tuple[str, int, str]]) -> None:
    """Append ``(transaction_type, amount_cents, payment_method_id)`` rows to the order's payment history."""
    rows = await fetch_all(conn, NEXT_SEQ, (order_id,))
    seq = rows[0][0]
    async with conn.cursor() as cur:
        await cur.executemany(INSERT_PAYMENT, [(order_id, seq + i, user_id, kind, amount, pm)
                                               for i, (kind, amount, pm) in enumerate(entries)])
