"""The retail schema and tau2's ``db.json`` into it, with COPY.

- :func:`read_db_json` / :func:`read_tasks` read tau2's data as shipped in ``data/retail/``
  (gzip-compressed, see ``data/retail/PROVENANCE.md``).
- :func:`create_schema` / :func:`create_schema_sync` run ``schema.sql`` (``CREATE SCHEMA retail``
  and its tables).
- :func:`load` / :func:`load_sync` fill the (empty) tables from a ``db.json`` dict with one
  ``COPY ... FROM STDIN (FORMAT BINARY)`` per table: 7,493 rows in about 0.2 s (best of 5 on a
  busy two-core machine; about half of it is the foreign-key checks). The async one is for a
  test's or a notebook's connection, the sync one for building a template database.

:func:`table_rows` is the pure conversion (JSON -> rows per table), shared by both. Money becomes
integer cents; an amount that is not a whole number of cents is refused (``ValueError``), since the
export could not give it back exactly.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import psycopg

SCHEMA = "retail"
SCHEMA_SQL_PATH = Path(__file__).resolve().with_name("schema.sql")
# the repository's data/retail/ (agentlab/domains/retail/load.py -> repo root); AGENTLAB_RETAIL_DATA overrides
DATA_DIR = Path(os.environ.get("AGENTLAB_RETAIL_DATA") or Path(__file__).resolve().parents[3] / "data" / "retail")

# table -> columns, in FK order (a table only references tables above it)
COLUMNS: dict[str, tuple[str, ...]] = {
    "products": ("product_id", "position", "name"),
    "variants": ("item_id", "product_id", "position", "options", "available", "price_cents"),
    "users": ("user_id", "position", "first_name", "last_name", "address1", "address2", "city", "country",
              "state", "zip", "email"),
    "payment_methods": ("payment_method_id", "user_id", "position", "source", "brand", "last_four",
                        "balance_cents"),
    "orders": ("order_id", "position", "user_id", "user_position", "address1", "address2", "city", "country",
               "state", "zip", "status", "cancel_reason", "exchange_items", "exchange_new_items",
               "exchange_payment_method_id", "exchange_price_difference_cents", "return_items",
               "return_payment_method_id"),
    "order_items": ("order_id", "position", "item_id", "product_id", "name", "price_cents", "options"),
    "fulfillments": ("order_id", "position", "tracking_ids", "item_ids"),
    "payment_history": ("order_id", "seq", "user_id", "transaction_type", "amount_cents", "payment_method_id"),
}
TABLES = tuple(COLUMNS)
ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")


# --------------------------------------------------------------------------- reading tau2's files

def _read_json(name: str, folder: str | Path | None) -> Any:
    folder = Path(folder) if folder is not None else DATA_DIR
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.exists():
        return json.loads(plain.read_text(encoding="utf-8"))
    with gzip.open(packed, "rt", encoding="utf-8") as f:
        return json.load(f)


def read_db_json(folder: str | Path | None = None) -> dict:
    """tau2's retail ``db.json`` (``{products, users, orders}``) from ``data/retail/`` or ``folder``."""
    return _read_json("db.json", folder)


def read_tasks(folder: str | Path | None = None) -> list[dict]:
    """tau2's 114 retail tasks (``tasks.json``) from ``data/retail/`` or ``folder``."""
    return _read_json("tasks.json", folder)


def read_expected_hashes(folder: str | Path | None = None) -> dict:
    """``expected_hashes.json``, written by ``scripts/tau2_expected_hashes.py`` from tau2's own code."""
    return _read_json("expected_hashes.json", folder)


def schema_sql() -> str:
    """The DDL of schema ``retail`` (``schema.sql``)."""
    return SCHEMA_SQL_PATH.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- JSON -> rows

def cents(amount: Any) -> int:
    """``amount`` (tau2's float money) as integer cents; refuses what is not a whole number of cents."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise ValueError(f"not an amount of money: {amount!r}")
    value = round(amount * 100)
    if value / 100 != amount:
        raise ValueError(f"not a whole number of cents: {amount!r}")
    return value


def _options(options: Any) -> dict:
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise ValueError(f"options must be a dict of strings: {options!r}")
    return dict(options)


def table_rows(db_json: dict) -> dict[str, list[tuple]]:
    """Rows per table (columns as in :data:`COLUMNS`) for a tau2 retail ``db.json`` dict."""
    rows: dict[str, list[tuple]] = {table: [] for table in TABLES}
    for p_pos, (product_id, product) in enumerate(db_json["products"].items()):
        rows["products"].append((product_id, p_pos, product["name"]))
        for v_pos, (item_id, variant) in enumerate(product["variants"].items()):
            rows["variants"].append((item_id, product_id, v_pos, _options(variant["options"]),
                                     bool(variant["available"]), cents(variant["price"])))
    order_place: dict[str, tuple[str, int]] = {}
    for u_pos, (user_id, user) in enumerate(db_json["users"].items()):
        address, name = user["address"], user["name"]
        rows["users"].append((user_id, u_pos, name["first_name"], name["last_name"],
                              *(address[f] for f in ADDRESS_FIELDS), user["email"]))
        for m_pos, (pm_id, pm) in enumerate(user["payment_methods"].items()):
            balance = pm.get("balance")
            rows["payment_methods"].append((pm_id, user_id, m_pos, pm["source"], pm.get("brand"),
                                            pm.get("last_four"), None if balance is None else cents(balance)))
        for o_pos, order_id in enumerate(user["orders"]):
            if order_id in order_place:
                raise ValueError(f"order {order_id!r} is listed twice in users' orders")
            order_place[order_id] = (user_id, o_pos)
    for position, (order_id, order) in enumerate(db_json["orders"].items()):
        user_id = order["user_id"]
        placed_user, user_position = order_place.get(order_id, (None, None))
        if placed_user != user_id:
            raise ValueError(f"order {order_id!r} is not in the orders list of its user {user_id!r}")
        address = order["address"]
        diff = order.get("exchange_price_difference")
        rows["orders"].append((
            order_id, position, user_id, user_position, *(address[f] for f in ADDRESS_FIELDS),
            order["status"], order.get("cancel_reason"), order.get("exchange_items"),
            order.get("exchange_new_items"), order.get("exchange_payment_method_id"),
            None if diff is None else cents(diff), order.get("return_items"), order.get("return_payment_method_id"),
        ))
        for i_pos, item in enumerate(order["items"]):
            rows["order_items"].append((order_id, i_pos, item["item_id"], item["product_id"], item["name"],
                                        cents(item["price"]), _options(item["options"])))
        for f_pos, fulfillment in enumerate(order["fulfillments"]):
            rows["fulfillments"].append((order_id, f_pos, list(fulfillment["tracking_id"]),
                                         list(fulfillment["item_ids"])))
        for seq, payment in enumerate(order["payment_history"]):
            rows["payment_history"].append((order_id, seq, user_id, payment["transaction_type"],
                                            cents(payment["amount"]), payment["payment_method_id"]))
    if len(order_place) != len(db_json["orders"]):
        missing = sorted(set(order_place) - set(db_json["orders"]))[:3]
        raise ValueError(f"users list orders that do not exist: {missing}")
    return rows


# --------------------------------------------------------------------------- COPY

# binary COPY: every column gets its exact type (set_types)
_ARRAY_COLUMNS = {"exchange_items", "exchange_new_items", "return_items", "tracking_ids", "item_ids"}


def _copy_sql(table: str) -> str:
    return f"COPY {SCHEMA}.{table} ({', '.join(COLUMNS[table])}) FROM STDIN (FORMAT BINARY)"


def _copy_types(table: str) -> list[str]:
    types = {"position": "int4", "user_position": "int4", "seq": "int4", "available": "bool",
             "options": "jsonb"}
    out = []
    for column in COLUMNS[table]:
        if column in _ARRAY_COLUMNS:
            out.append("text[]")
        elif column.endswith("_cents"):
            out.append("int8")
        else:
            out.append(types.get(column, "text"))
    return out


async def create_schema(conn: psycopg.AsyncConnection) -> None:
    """Run ``schema.sql`` on ``conn`` (inside the caller's transaction, if any)."""
    await conn.execute(schema_sql())


def create_schema_sync(conn: psycopg.Connection) -> None:
    """Run ``schema.sql`` on ``conn`` (sync, for building a template database)."""
    conn.execute(schema_sql())


async def load(conn: psycopg.AsyncConnection, db_json: dict | None = None) -> None:
    """Fill the empty ``retail`` tables from ``db_json`` (default: :func:`read_db_json`), with COPY.

    Runs in one transaction (the caller's, if one is open); never commits the caller's transaction.
    """
    rows = table_rows(read_db_json() if db_json is None else db_json)
    async with conn.transaction():
        async with conn.cursor() as cur:
            for table in TABLES:
                async with cur.copy(_copy_sql(table)) as copy:
                    copy.set_types(_copy_types(table))
                    for row in rows[table]:
                        await copy.write_row(row)


def load_sync(conn: psycopg.Connection, db_json: dict | None = None) -> None:
    """Sync :func:`load`, for building a template database."""
    rows = table_rows(read_db_json() if db_json is None else db_json)
    with conn.transaction():
        with conn.cursor() as cur:
            for table in TABLES:
                with cur.copy(_copy_sql(table)) as copy:
                    copy.set_types(_copy_types(table))
                    for row in rows[table]:
                        copy.write_row(row)
