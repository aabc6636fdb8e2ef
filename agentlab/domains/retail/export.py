"""The ``retail`` tables back into tau2's RetailDB JSON shape, and the canonical hash to compare states.

:func:`export_state` returns what tau2's ``RetailDB.model_dump()`` returns: ``{products, users,
orders}``, every key of every model (``None`` where tau2 has ``None``), lists in their position /
seq order, a user's ``orders`` in their original order, money as floats (cents / 100). Dicts are
built in tau2's insertion order, which tau2's hash ignores anyway (``sort_keys``).

:func:`canonical_hash` is tau2's ``get_dict_hash`` (``sha256(json.dumps(state, sort_keys=True,
default=str))``) on the state with every float rounded to 2 decimals: tau2's own floats can hold
values such as 17.98999999999998 where the port holds 1799 cents. ``scripts/tau2_expected_hashes.py``
computes the same hash of tau2's states.

The row -> JSON functions (:func:`order_json`, :func:`user_json`, :func:`product_json`,
:func:`variant_json`) are also what the tools return, as tau2's tools return these models.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import psycopg

# --------------------------------------------------------------------------- queries

PRODUCTS = "SELECT product_id, name FROM retail.products {where} ORDER BY position"
VARIANTS = ("SELECT product_id, item_id, options::text, available, price_cents FROM retail.variants {where} "
            "ORDER BY product_id, position")
USERS = ("SELECT user_id, first_name, last_name, address1, address2, city, country, state, zip, email "
         "FROM retail.users {where} ORDER BY position")
PAYMENT_METHODS = ("SELECT user_id, payment_method_id, source, brand, last_four, balance_cents "
                   "FROM retail.payment_methods {where} ORDER BY user_id, position")
USER_ORDERS = "SELECT user_id, order_id FROM retail.orders {where} ORDER BY user_id, user_position"
ORDERS = ("SELECT order_id, user_id, address1, address2, city, country, state, zip, status, cancel_reason, "
          "exchange_items, exchange_new_items, exchange_payment_method_id, exchange_price_difference_cents, "
          "return_items, return_payment_method_id FROM retail.orders {where} ORDER BY position")
ORDER_ITEMS = ("SELECT order_id, name, product_id, item_id, price_cents, options::text FROM retail.order_items {where} "
               "ORDER BY order_id, position")
FULFILLMENTS = "SELECT order_id, tracking_ids, item_ids FROM retail.fulfillments {where} ORDER BY order_id, position"
PAYMENT_HISTORY = ("SELECT order_id, transaction_type, amount_cents, payment_method_id FROM retail.payment_history "
                   "{where} ORDER BY order_id, seq")

# the queries of one part of the state, in the order the assemblers take their rows
PRODUCT_QUERIES = (PRODUCTS, VARIANTS)
USER_QUERIES = (USERS, PAYMENT_METHODS, USER_ORDERS)
ORDER_QUERIES = (ORDERS, ORDER_ITEMS, FULFILLMENTS, PAYMENT_HISTORY)


def money(value_cents: int | None) -> float | None:
    """Cents as tau2's float money (``1799`` -> ``17.99``)."""
    return None if value_cents is None else value_cents / 100


def _address(a1, a2, city, country, state, zip_) -> dict:
    return {"address1": a1, "address2": a2, "city": city, "country": country, "state": state, "zip": zip_}


@functools.lru_cache(maxsize=4096)
def _parse_options(text: str) -> dict:
    """An options jsonb read as text, parsed once per distinct text (591 variants, 3,569 rows to read)."""
    return json.loads(text)


def _group(rows: list[tuple]) -> dict[str, list[tuple]]:
    """Rows whose first column is the parent's key, grouped by it (order kept)."""
    out: dict[str, list[tuple]] = {}
    for row in rows:
        out.setdefault(row[0], []).append(row[1:])
    return out


# --------------------------------------------------------------------------- rows -> tau2's JSON

def variant_json(item_id: str, options: dict, available: bool, price_cents: int) -> dict:
    """tau2's ``Variant``."""
    return {"item_id": item_id, "options": dict(options), "available": available, "price": money(price_cents)}


def product_json(product_id: str, name: str, variants: list[tuple]) -> dict:
    """tau2's ``Product``; ``variants`` are ``(item_id, options, available, price_cents)`` in position order."""
    return {"name": name, "product_id": product_id,
            "variants": {v[0]: variant_json(*v) for v in variants}}


def payment_method_json(pm_id: str, source: str, brand: str | None, last_four: str | None,
                        balance_cents: int | None) -> dict:
    """tau2's ``CreditCard``, ``GiftCard`` or ``Paypal`` (each has only its own keys)."""
    if source == "credit_card":
        return {"source": source, "id": pm_id, "brand": brand, "last_four": last_four}
    if source == "gift_card":
        return {"source": source, "id": pm_id, "balance": money(balance_cents)}
    return {"source": source, "id": pm_id}


def user_json(row: tuple, payment_methods: list[tuple], orders: list[str]) -> dict:
    """tau2's ``User`` from a :data:`USERS` row, its payment-method rows and its order ids in list order."""
    user_id, first, last, a1, a2, city, country, state, zip_, email = row
    return {
        "user_id": user_id,
        "name": {"first_name": first, "last_name": last},
        "address": _address(a1, a2, city, country, state, zip_),
        "email": email,
        "payment_methods": {pm[0]: payment_method_json(*pm) for pm in payment_methods},
        "orders": list(orders),
    }


def order_json(row: tuple, items: list[tuple], fulfillments: list[tuple], payments: list[tuple]) -> dict:
    """tau2's ``Order`` from an :data:`ORDERS` row and its item, fulfillment and payment rows (in order)."""
    (order_id, user_id, a1, a2, city, country, state, zip_, status, cancel_reason, exchange_items,
     exchange_new_items, exchange_pm, exchange_diff_cents, return_items, return_pm) = row
    return {
        "order_id": order_id,
        "user_id": user_id,
        "address": _address(a1, a2, city, country, state, zip_),
        "items": [{"name": name, "product_id": product_id, "item_id": item_id, "price": money(price_cents),
                   "options": dict(options)}
                  for name, product_id, item_id, price_cents, options in items],
        "status": status,
        "fulfillments": [{"tracking_id": list(tracking), "item_ids": list(item_ids)}
                         for tracking, item_ids in fulfillments],
        "payment_history": [{"transaction_type": kind, "amount": money(amount_cents), "payment_method_id": pm}
                            for kind, amount_cents, pm in payments],
        "cancel_reason": cancel_reason,
        "exchange_items": None if exchange_items is None else list(exchange_items),
        "exchange_new_items": None if exchange_new_items is None else list(exchange_new_items),
        "exchange_payment_method_id": exchange_pm,
        # tau2 sums the price differences from the int 0, so an exchange of no items stores the int 0
        "exchange_price_difference": 0 if exchange_items == [] and exchange_diff_cents == 0
        else money(exchange_diff_cents),
        "return_items": None if return_items is None else list(return_items),
        "return_payment_method_id": return_pm,
    }


def assemble_products(products: list[tuple], variants: list[tuple]) -> dict[str, dict]:
    """Products from :data:`PRODUCTS` and :data:`VARIANTS` rows (options as jsonb text)."""
    by_product = _group([(pid, iid, _parse_options(opts), available, price)
                         for pid, iid, opts, available, price in variants])
    return {pid: product_json(pid, name, by_product.get(pid, [])) for pid, name in products}


def assemble_users(users: list[tuple], payment_methods: list[tuple], user_orders: list[tuple]) -> dict[str, dict]:
    pms, orders = _group(payment_methods), _group(user_orders)
    return {u[0]: user_json(u, pms.get(u[0], []), [o[0] for o in orders.get(u[0], [])]) for u in users}


def assemble_orders(orders: list[tuple], items: list[tuple], fulfillments: list[tuple],
                    payments: list[tuple]) -> dict[str, dict]:
    """Orders from :data:`ORDER_QUERIES` rows (item options as jsonb text)."""
    by_items = _group([(oid, name, pid, iid, price, _parse_options(opts))
                       for oid, name, pid, iid, price, opts in items])
    by_fulfillments, by_payments = _group(fulfillments), _group(payments)
    return {o[0]: order_json(o, by_items.get(o[0], []), by_fulfillments.get(o[0], []), by_payments.get(o[0], []))
            for o in orders}


# --------------------------------------------------------------------------- reading the database

async def fetch_rows(conn: psycopg.AsyncConnection, queries: tuple[str, ...], where: str = "",
                 params: tuple = ()) -> list[list[tuple]]:
    out = []
    for query in queries:
        cur = await conn.execute(query.format(where=where), params)
        out.append(await cur.fetchall())
    return out


def _fetch_sync(conn: psycopg.Connection, queries: tuple[str, ...], where: str = "",
                params: tuple = ()) -> list[list[tuple]]:
    return [conn.execute(query.format(where=where), params).fetchall() for query in queries]


async def export_state(conn: psycopg.AsyncConnection) -> dict:
    """The whole ``retail`` schema as tau2's ``RetailDB.model_dump()`` (money as floats)."""
    return {
        "products": assemble_products(*await fetch_rows(conn, PRODUCT_QUERIES)),
        "users": assemble_users(*await fetch_rows(conn, USER_QUERIES)),
        "orders": assemble_orders(*await fetch_rows(conn, ORDER_QUERIES)),
    }


def export_state_sync(conn: psycopg.Connection) -> dict:
    """Sync :func:`export_state` (for checking a template database)."""
    return {
        "products": assemble_products(*_fetch_sync(conn, PRODUCT_QUERIES)),
        "users": assemble_users(*_fetch_sync(conn, USER_QUERIES)),
        "orders": assemble_orders(*_fetch_sync(conn, ORDER_QUERIES)),
    }


async def fetch_order(conn: psycopg.AsyncConnection, order_id: str) -> dict | None:
    """One order as tau2's ``Order`` JSON, or ``None``."""
    orders = assemble_orders(*await fetch_rows(conn, ORDER_QUERIES, "WHERE order_id = %s", (order_id,)))
    return orders.get(order_id)


async def fetch_user(conn: psycopg.AsyncConnection, user_id: str) -> dict | None:
    """One user as tau2's ``User`` JSON, or ``None``."""
    users = assemble_users(*await fetch_rows(conn, USER_QUERIES, "WHERE user_id = %s", (user_id,)))
    return users.get(user_id)


async def fetch_product(conn: psycopg.AsyncConnection, product_id: str) -> dict | None:
    """One product as tau2's ``Product`` JSON, or ``None``."""
    products = assemble_products(*await fetch_rows(conn, PRODUCT_QUERIES, "WHERE product_id = %s", (product_id,)))
    return products.get(product_id)


# --------------------------------------------------------------------------- the canonical hash

def round_floats(value: Any) -> Any:
    """``value`` with every float rounded to 2 decimals, recursively through dicts and lists (and tuples,
    which become lists, as JSON has them). A -0.0 becomes 0.0: tau2's float sums can round to -0.0
    (an exchange whose prices cancel out) where the port's cents give 0."""
    kind = type(value)
    if kind is dict:
        return {k: round_floats(v) for k, v in value.items()}
    if kind is str or kind is int or value is None or kind is bool:
        return value
    if kind is float:
        return round(value, 2) + 0.0  # + 0.0: -0.0 becomes 0.0
    if kind is list or kind is tuple:
        return [round_floats(v) for v in value]
    if isinstance(value, float):
        return round(value, 2) + 0.0  # + 0.0: -0.0 becomes 0.0
    if isinstance(value, dict):
        return {k: round_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [round_floats(v) for v in value]
    return value


def canonical_hash(state: Any) -> str:
    """``sha256(json.dumps(round_floats(state), sort_keys=True, default=str))``, hex.

    The same as tau2's ``get_dict_hash`` after rounding every float to 2 decimals, so that a state
    in cents and tau2's float state of the same data compare equal.
    """
    text = json.dumps(round_floats(state), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
