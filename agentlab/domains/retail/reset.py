"""A change log on the retail tables: reset a database to the opening state, and hash the state fast.

A tau2 task acts on the seeded rows, so each task needs the opening state. Copying the template for
every task (``CREATE DATABASE ... TEMPLATE``, new pools, ``DROP DATABASE``) costs about 0.3 s of server
and client time; a task changes a handful of rows. So the domain keeps, in its template:

- ``retail.changed (kind, key)``: an ``AFTER INSERT OR UPDATE OR DELETE`` row trigger on each of the eight
  tables records the tau2 entity a written row belongs to: ``orders`` (an order and its items,
  fulfillments and payment history; an order row also records its user, whose ``orders`` list it is
  in), ``users`` (a user and its payment methods) or ``products`` (a product and its variants). The
  trigger is ``SECURITY DEFINER``: the agent role writes the log without any right on it, and a rolled
  back write leaves no entry (the entry is in the same transaction);
- ``retail.snapshot_<table>``: a copy of each table as seeded.

:func:`reset_state` calls ``retail.reset_to_opening()`` (:data:`RESET_FUNCTION_SQL`), which puts back,
from the snapshot, every entity the log names (children deleted and re-inserted, parents upserted, rows
the snapshot lacks deleted) and empties the log, in one statement: the database is then in the opening state again (``tests/test_tau2_replay.py`` checks the
full export's hash after a reset). :class:`OpeningPieces` holds the opening state as the JSON text of each
entity, so that :meth:`OpeningPieces.state_hash` exports only the entities the log names and gives
the same :func:`~agentlab.domains.retail.export.canonical_hash` as the full export (the text tau2's
``json.dumps(sort_keys=True)`` writes is the entities' texts joined in key order).

A ``TRUNCATE`` (which no row trigger sees) is refused by a statement trigger: the log would miss it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import psycopg

from agentlab.domains.retail.export import (
    ORDER_QUERIES,
    PRODUCT_QUERIES,
    USER_QUERIES,
    assemble_orders,
    assemble_products,
    assemble_users,
    fetch_rows,
    round_floats,
)
from agentlab.domains.retail.load import COLUMNS

# table -> (entity kind, its key column[, a second kind, its key column])
ENTITY_OF: dict[str, tuple[str, ...]] = {
    "products": ("products", "product_id"),
    "variants": ("products", "product_id"),
    "users": ("users", "user_id"),
    "payment_methods": ("users", "user_id"),
    "orders": ("orders", "order_id", "users", "user_id"),
    "order_items": ("orders", "order_id"),
    "fulfillments": ("orders", "order_id"),
    "payment_history": ("orders", "order_id"),
}
KINDS = ("orders", "products", "users")  # tau2's RetailDB keys, in the order json.dumps(sort_keys=True) writes them
PRIMARY_KEYS = {"products": ("product_id",), "variants": ("item_id",), "users": ("user_id",),
                "payment_methods": ("payment_method_id",), "orders": ("order_id",)}
CHILDREN = ("order_items", "fulfillments", "payment_history")  # deleted and re-inserted with their order

CHANGE_LOG_SQL = """
CREATE TABLE retail.changed (
    kind text NOT NULL CHECK (kind IN ('orders', 'products', 'users')),
    key  text NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE FUNCTION retail.record_change() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    i integer := 0;
BEGIN
    WHILE i < TG_NARGS LOOP  -- pairs of (kind, key column)
        IF TG_OP <> 'INSERT' THEN
            INSERT INTO retail.changed VALUES (TG_ARGV[i], to_jsonb(OLD) ->> TG_ARGV[i + 1]) ON CONFLICT DO NOTHING;
        END IF;
        IF TG_OP <> 'DELETE' THEN
            INSERT INTO retail.changed VALUES (TG_ARGV[i], to_jsonb(NEW) ->> TG_ARGV[i + 1]) ON CONFLICT DO NOTHING;
        END IF;
        i := i + 2;
    END LOOP;
    RETURN NULL;
END $$;
CREATE FUNCTION retail.refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE of retail.% is refused: the change log (retail.changed) would miss it', TG_TABLE_NAME;
END $$;
""" + "".join(
    f"CREATE TRIGGER {table}_changed AFTER INSERT OR UPDATE OR DELETE ON retail.{table} FOR EACH ROW "
    f"EXECUTE FUNCTION retail.record_change({', '.join(repr(a) for a in args)});\n"
    f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON retail.{table} FOR EACH STATEMENT "
    f"EXECUTE FUNCTION retail.refuse_truncate();\n"
    f"CREATE TABLE retail.snapshot_{table} (LIKE retail.{table} INCLUDING INDEXES);\n"
    for table, args in ENTITY_OF.items()
)

SNAPSHOT_SQL = "".join(f"INSERT INTO retail.snapshot_{t} SELECT * FROM retail.{t};\n" for t in ENTITY_OF) + \
    "DELETE FROM retail.changed;\n"
"""Run by the seed after the load: the snapshot of every table, and an empty change log."""

CHANGED = "SELECT kind, array_agg(key ORDER BY key) FROM retail.changed GROUP BY kind"


def _in_snapshot(table: str) -> str:
    keys = PRIMARY_KEYS[table]
    match = " AND ".join(f"s.{k} = t.{k}" for k in keys)
    return f"EXISTS (SELECT 1 FROM retail.snapshot_{table} s WHERE {match})"


def _upsert(table: str, where: str) -> str:
    cols = COLUMNS[table]
    keys = PRIMARY_KEYS[table]
    rest = [c for c in cols if c not in keys]
    return (f"INSERT INTO retail.{table} ({', '.join(cols)}) SELECT {', '.join(cols)} FROM retail.snapshot_{table} "
            f"WHERE {where} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET ({', '.join(rest)}) = "
            f"ROW({', '.join('EXCLUDED.' + c for c in rest)})")


_RESET: tuple[str, ...] = (
    *(f"DELETE FROM retail.{t} WHERE order_id = ANY(%(orders)s)" for t in CHILDREN),
    f"DELETE FROM retail.orders t WHERE order_id = ANY(%(orders)s) AND NOT {_in_snapshot('orders')}",
    _upsert("products", "product_id = ANY(%(products)s)"),
    _upsert("variants", "product_id = ANY(%(products)s)"),
    _upsert("users", "user_id = ANY(%(users)s)"),
    _upsert("payment_methods", "user_id = ANY(%(users)s)"),
    _upsert("orders", "order_id = ANY(%(orders)s)"),
    f"DELETE FROM retail.payment_methods t WHERE user_id = ANY(%(users)s) AND NOT {_in_snapshot('payment_methods')}",
    f"DELETE FROM retail.variants t WHERE product_id = ANY(%(products)s) AND NOT {_in_snapshot('variants')}",
    f"DELETE FROM retail.users t WHERE user_id = ANY(%(users)s) AND NOT {_in_snapshot('users')}",
    f"DELETE FROM retail.products t WHERE product_id = ANY(%(products)s) AND NOT {_in_snapshot('products')}",
    *(f"INSERT INTO retail.{t} ({', '.join(COLUMNS[t])}) SELECT {', '.join(COLUMNS[t])} FROM retail.snapshot_{t} "
      f"WHERE order_id = ANY(%(orders)s)" for t in CHILDREN),
    "DELETE FROM retail.changed",
)


_VARS = {"orders": "_orders", "products": "_products", "users": "_users"}
RESET_FUNCTION_SQL = """
CREATE FUNCTION retail.reset_to_opening() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    _orders   text[] := ARRAY(SELECT key FROM retail.changed WHERE kind = 'orders');
    _products text[] := ARRAY(SELECT key FROM retail.changed WHERE kind = 'products');
    _users    text[] := ARRAY(SELECT key FROM retail.changed WHERE kind = 'users');
    _n integer := (SELECT count(*) FROM retail.changed);
BEGIN
    IF _n = 0 THEN
        RETURN 0;
    END IF;
""" + "".join(f"    {statement % _VARS};\n" for statement in _RESET) + """    RETURN _n;
END $$;
"""
"""``retail.reset_to_opening()``: the reset (:data:`_RESET`, in that order) in one call; returns how many
entities it put back."""

CHANGE_LOG_SQL += RESET_FUNCTION_SQL


async def changed(conn: psycopg.AsyncConnection) -> dict[str, list[str]]:
    """The entities written since the opening (or the last reset): kind -> keys (sorted)."""
    rows = await (await conn.execute(CHANGED)).fetchall()
    return {kind: list(keys) for kind, keys in rows}


async def reset_state(conn: psycopg.AsyncConnection) -> int:
    """Put every entity the change log names back as seeded and empty the log, in one statement
    (``retail.reset_to_opening()``, on a connection of the kit's own role); return how many entities
    were put back."""
    return (await (await conn.execute("SELECT retail.reset_to_opening()")).fetchone())[0]


async def fetch_entities(conn: psycopg.AsyncConnection, keys: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """tau2's JSON of the named entities (kind -> key -> JSON); a key no row has any more is absent."""
    out: dict[str, dict[str, Any]] = {}
    for kind, queries, column, assemble in (("orders", ORDER_QUERIES, "order_id", assemble_orders),
                                            ("products", PRODUCT_QUERIES, "product_id", assemble_products),
                                            ("users", USER_QUERIES, "user_id", assemble_users)):
        if keys.get(kind):
            out[kind] = assemble(*await fetch_rows(conn, queries, f"WHERE {column} = ANY(%s)", (keys[kind],)))
    return out


def entity_text(value: Any) -> str:
    """One entity as :func:`~agentlab.domains.retail.export.canonical_hash` writes it inside the state."""
    return json.dumps(round_floats(value), sort_keys=True, default=str)


class OpeningPieces:
    """The opening state (tau2's ``RetailDB`` JSON, as :func:`~agentlab.domains.retail.export.export_state`
    gives it) kept as the JSON text of each entity, for :meth:`state_hash`."""

    def __init__(self, state: dict):
        if set(state) != set(KINDS):
            raise ValueError(f"a retail state has the keys {KINDS}, not {sorted(state)}")
        # per kind: the keys in sorted order, and '"key": {...}' for each, as json.dumps(sort_keys=True) writes them
        self.keys = {kind: sorted(state[kind]) for kind in KINDS}
        self.items = {kind: [self._item(k, state[kind][k]) for k in self.keys[kind]] for kind in KINDS}
        self.index = {kind: {k: n for n, k in enumerate(self.keys[kind])} for kind in KINDS}

    @staticmethod
    def _item(key: str, value: Any) -> str:
        return f"{json.dumps(key)}: {entity_text(value)}"

    def text(self, entities: dict[str, dict[str, Any]] | None = None, written: dict[str, list[str]] | None = None) -> str:
        """The canonical JSON text of the opening state with ``entities`` (kind -> key -> JSON) in place of
        the ``written`` keys (a written key missing from ``entities`` is gone)."""
        entities, written = entities or {}, written or {}
        parts = []
        for kind in KINDS:
            items = self.items[kind]
            if written.get(kind):
                now, index = entities.get(kind, {}), self.index[kind]
                items, keys, added = list(items), self.keys[kind], []
                for key in written[kind]:
                    item = self._item(key, now[key]) if key in now else ""  # "": the entity is gone
                    if key in index:
                        items[index[key]] = item
                    elif item:
                        added.append((key, item))
                if added:  # keys the opening lacks: merged in key order
                    items = [item for _, item in sorted([*zip(keys, items), *added])]
                items = [item for item in items if item]
            parts.append(f"{json.dumps(kind)}: {{{', '.join(items)}}}")
        return "{" + ", ".join(parts) + "}"

    def hash_with(self, entities: dict[str, dict[str, Any]] | None = None,
                  written: dict[str, list[str]] | None = None) -> str:
        """sha256 hex of :meth:`text`: :func:`~agentlab.domains.retail.export.canonical_hash` of that state."""
        return hashlib.sha256(self.text(entities, written).encode()).hexdigest()

    async def state_hash(self, conn: psycopg.AsyncConnection) -> str:
        """The canonical hash of the database's state, reading only the entities its change log names."""
        written = await changed(conn)
        return self.hash_with(await fetch_entities(conn, written), written)


__all__ = ["CHANGE_LOG_SQL", "RESET_FUNCTION_SQL", "SNAPSHOT_SQL", "OpeningPieces", "changed", "entity_text",
           "fetch_entities", "reset_state"]
