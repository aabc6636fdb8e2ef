"""tau2-bench retail as a :class:`~agentlab.core.domain.Domain`, on the domain API alone.

- ``toolset``: the 16 tools of :mod:`.tools` (7 write), from :data:`.tools.SPECS`;
- ``migrations``: ``schema.sql`` plus the agent role's grants (:data:`GRANTS`), then the opening-state
  tables the invariants compare with (:data:`OPENING_TABLES`), then the change log and the snapshot
  tables of :mod:`.reset`; append-only;
- ``seed``: :func:`seed`, tau2's ``db.json`` by COPY, then the snapshots of the opening state, run once
  into the retail template database: a fresh database is a template copy (about 0.1 s), and a used one
  goes back to the opening state with :func:`.reset.reset_state` (a few milliseconds);
- ``scenarios``: the 114 tasks, ``tau2-<task>``, each golden action one step with one planned call;
- ``create_rows``: nothing (an episode acts on the seeded rows; each task gets a database of its own);
- ``invariants``: :data:`INVARIANTS` (gift-card balances, payment history against status, the order state
  machine, items against their variants, no payment refunded twice: :func:`paid_twice`), read from the
  database against the opening snapshot; the concurrency races (:mod:`.concurrency`) check the same on
  their own rows;
- ``export_state``: tau2's ``RetailDB`` JSON (:func:`.export.export_state`), for the canonical hash.

:func:`retail_domain` builds one with the last-variant bug reproduced (the default, :data:`DOMAIN`:
tau2's own hashes match) or fixed (``reproduce_last_variant_bug=False``: the 5 tasks the bug touches end
in another state on purpose, and the ``item_matches_variant`` invariant holds there).
"""

from __future__ import annotations

from agentlab.core.agent_role import AGENT_ROLE
from agentlab.core.domain import Domain, Invariant, InvariantContext, Migration
from agentlab.core.errors import ErrorHints
from agentlab.core.scenario import PlannedCall, Scenario
from agentlab.core.toolspec import Toolset, ToolSpec
from agentlab.domains.retail.concurrency import CONCURRENCY
from agentlab.domains.retail.export import export_state as _export_state
from agentlab.domains.retail.load import DATA_DIR, load_sync, read_tasks, schema_sql
from agentlab.domains.retail.order_checks import (
    ORDER_MOVES,
    TRANSITIONS,
    order_fields,
    refunded_twice,
)
from agentlab.domains.retail.reset import CHANGE_LOG_SQL, SNAPSHOT_SQL
from agentlab.domains.retail.tools import specs

TENANT = "tau2"
ERROR_HINTS = ErrorHints(constraints={
    "orders_cancel_reason_valid": "Invalid reason",  # tau2's words for the refusals the schema makes
    "orders_exchange_payment_method_owned": "Payment method not found",
})
LAST_VARIANT_BUG_TASKS = ("20", "21", "36", "37", "100")
"""The tasks whose golden actions meet tau2's last-variant bug (9 items in all; see :mod:`.tools`)."""

# What the tools need, and no more: every table is read; row locks (FOR UPDATE / FOR SHARE) need the
# UPDATE privilege on at least one column, so variants get UPDATE on ``available`` only to be lockable
GRANTS = f"""
GRANT USAGE ON SCHEMA retail TO {AGENT_ROLE};
GRANT SELECT ON retail.products, retail.variants, retail.users, retail.payment_methods, retail.orders,
    retail.order_items, retail.fulfillments, retail.payment_history TO {AGENT_ROLE};
GRANT UPDATE (available) ON retail.variants TO {AGENT_ROLE};
GRANT UPDATE (address1, address2, city, state, country, zip) ON retail.users TO {AGENT_ROLE};
GRANT UPDATE (balance_cents) ON retail.payment_methods TO {AGENT_ROLE};
GRANT UPDATE (address1, address2, city, state, country, zip, status, cancel_reason, exchange_items,
    exchange_new_items, exchange_payment_method_id, exchange_price_difference_cents, return_items,
    return_payment_method_id) ON retail.orders TO {AGENT_ROLE};
GRANT UPDATE (item_id, price_cents, options) ON retail.order_items TO {AGENT_ROLE};
GRANT INSERT ON retail.payment_history TO {AGENT_ROLE};
"""

# Every table the tools reach, shared on purpose: retail is one shop, tau2's, in a database of its own (one
# tenant, TENANT), so row-level security by tenant would hide nothing. The agent role's grants above still
# hold the tools to what they need; notebook 17 shows row security per user on top (case C42).
SHARED_TABLES = ("retail.fulfillments", "retail.order_items", "retail.orders", "retail.payment_history",
                 "retail.payment_methods", "retail.products", "retail.users", "retail.variants")

# The opening state the invariants compare with; the agent role cannot read or write these tables
OPENING_TABLES = """
CREATE TABLE retail.opening_gift_cards (
    payment_method_id text PRIMARY KEY,
    balance_cents     bigint NOT NULL
);
CREATE TABLE retail.opening_orders (
    order_id text PRIMARY KEY,
    status   text NOT NULL,
    payments integer NOT NULL  -- length of the payment history at the opening
);
CREATE TABLE retail.opening_order_items (
    order_id    text NOT NULL,
    position    integer NOT NULL,
    item_id     text NOT NULL,
    price_cents bigint NOT NULL,
    options     jsonb NOT NULL,
    PRIMARY KEY (order_id, position)
);
"""
SNAPSHOT_OPENING = """
INSERT INTO retail.opening_gift_cards SELECT payment_method_id, balance_cents FROM retail.payment_methods
    WHERE source = 'gift_card';
INSERT INTO retail.opening_orders SELECT o.order_id, o.status,
    (SELECT count(*) FROM retail.payment_history h WHERE h.order_id = o.order_id) FROM retail.orders o;
INSERT INTO retail.opening_order_items SELECT order_id, position, item_id, price_cents, options FROM retail.order_items;
"""

MIGRATIONS = (
    Migration("retail schema", schema_sql() + GRANTS),
    Migration("retail opening state", OPENING_TABLES),
    Migration("retail change log and snapshot", CHANGE_LOG_SQL),
)


def seed(conn) -> None:
    """tau2's ``db.json`` into the retail tables (COPY), then the opening snapshots (sync connection): the
    invariants' (:data:`SNAPSHOT_OPENING`) and the reset's (:data:`.reset.SNAPSHOT_SQL`, which also empties
    the change log the load filled)."""
    load_sync(conn)
    conn.execute(SNAPSHOT_OPENING)
    conn.execute(SNAPSHOT_SQL)


# --------------------------------------------------------------------------- invariants

# Each query looks only at the entities the change log names (retail.changed, :mod:`.reset`): a row that
# differs from the opening state was written, so its entity is in the log, and the results are those of
# the whole tables (the log is a trigger's, not the tools' code), read in a few milliseconds.
LOGGED_ORDERS = "SELECT key FROM retail.changed WHERE kind = 'orders'"
# payment-history rows written since the opening (an order's rows from position `payments` on)
NEW_PAYMENTS = f"""
SELECT h.* FROM retail.payment_history h LEFT JOIN retail.opening_orders o USING (order_id)
WHERE h.seq >= coalesce(o.payments, 0) AND h.order_id IN ({LOGGED_ORDERS})
"""
GIFT_CARD_BALANCES = f"""
SELECT p.payment_method_id, g.balance_cents, p.balance_cents,
       coalesce(sum(CASE n.transaction_type WHEN 'refund' THEN n.amount_cents ELSE -n.amount_cents END), 0)
FROM retail.payment_methods p
JOIN retail.opening_gift_cards g USING (payment_method_id)
LEFT JOIN ({NEW_PAYMENTS}) n ON n.payment_method_id = p.payment_method_id AND n.user_id = p.user_id
WHERE p.user_id IN (SELECT key FROM retail.changed WHERE kind = 'users')
   OR p.user_id IN (SELECT user_id FROM retail.orders WHERE order_id IN ({LOGGED_ORDERS}))
GROUP BY 1, 2, 3
HAVING p.balance_cents IS DISTINCT FROM g.balance_cents
       + coalesce(sum(CASE n.transaction_type WHEN 'refund' THEN n.amount_cents ELSE -n.amount_cents END), 0)
ORDER BY 1
"""
# orders changed since the opening (status, payment history or an item), with what they paid and hold
CHANGED_ORDERS = f"""
WITH logged AS ({LOGGED_ORDERS}), paid AS (
    SELECT order_id, count(*) AS n,
           sum(CASE transaction_type WHEN 'payment' THEN amount_cents ELSE -amount_cents END) AS net_cents
    FROM retail.payment_history WHERE order_id IN (SELECT key FROM logged) GROUP BY order_id
), held AS (
    SELECT order_id, sum(price_cents) AS items_cents FROM retail.order_items
    WHERE order_id IN (SELECT key FROM logged) GROUP BY order_id
), items_changed AS (
    SELECT DISTINCT i.order_id FROM retail.order_items i
    LEFT JOIN retail.opening_order_items oi USING (order_id, position)
    WHERE i.order_id IN (SELECT key FROM logged)
      AND (oi.item_id, oi.price_cents, oi.options) IS DISTINCT FROM (i.item_id, i.price_cents, i.options)
)
SELECT o.order_id, op.status, o.status, coalesce(paid.net_cents, 0), coalesce(held.items_cents, 0)
FROM retail.orders o
LEFT JOIN retail.opening_orders op USING (order_id)
LEFT JOIN paid USING (order_id)
LEFT JOIN held USING (order_id)
WHERE o.order_id IN (SELECT key FROM logged)
  AND (op.order_id IS NULL OR op.status <> o.status OR op.payments <> coalesce(paid.n, 0)
       OR o.order_id IN (SELECT order_id FROM items_changed))
ORDER BY o.order_id
"""
CHANGED_ITEMS = f"""
SELECT i.order_id, i.position, i.item_id, i.price_cents, v.price_cents, i.options = v.options
FROM retail.order_items i
LEFT JOIN retail.opening_order_items oi USING (order_id, position)
LEFT JOIN retail.variants v ON v.product_id = i.product_id AND v.item_id = i.item_id
WHERE i.order_id IN ({LOGGED_ORDERS})
  AND (oi.item_id, oi.price_cents, oi.options) IS DISTINCT FROM (i.item_id, i.price_cents, i.options)
  AND (v.item_id IS NULL OR v.price_cents <> i.price_cents OR v.options <> i.options)
ORDER BY 1, 2
"""



def _money(cents: int) -> str:
    return f"{cents / 100:.2f}"


async def gift_card_balance(ctx: InvariantContext) -> list[str]:
    """Each gift card's balance = its opening balance + the refunds - the payments recorded on it since."""
    rows = await (await ctx.conn.execute(GIFT_CARD_BALANCES)).fetchall()
    return [f"gift card {pm}: balance {_money(have)}, opening {_money(opening)} + recorded {_money(net)} = "
            f"{_money(opening + net)}" for pm, opening, have, net in rows]


async def _changed_orders(ctx: InvariantContext) -> list[tuple]:
    return await (await ctx.conn.execute(CHANGED_ORDERS)).fetchall()


async def order_payments(ctx: InvariantContext) -> list[str]:
    """Each order changed since the opening: its payment history agrees with its status (a cancelled
    order is refunded in full; any other is paid for exactly the items it holds)."""
    out = []
    for order_id, _was, status, net, items in await _changed_orders(ctx):
        if status == "cancelled" and net != 0:
            out.append(f"order {order_id} is cancelled but its payment history nets {_money(net)}, not 0.00")
        elif status != "cancelled" and net != items:
            out.append(f"order {order_id} ({status}): payments net {_money(net)}, its items cost {_money(items)}")
    return out


async def order_status_transition(ctx: InvariantContext) -> list[str]:
    """Each order's status moved from its opening status along the order state machine (:data:`TRANSITIONS`)."""
    out = []
    for order_id, was, status, _net, _items in await _changed_orders(ctx):
        if was is None:
            out.append(f"order {order_id} did not exist at the opening")
        elif status != was and status not in TRANSITIONS.get(was, ()):
            out.append(f"order {order_id}: status {was!r} -> {status!r} is not a transition of the order state machine")
    # each tool moves an order once: its fields must not record two moves (two tools racing on one order)
    for order_id, _was, status, returned, exchanged, modified, _net, _items in await (
            await ctx.conn.execute(ORDER_MOVES.format(orders=LOGGED_ORDERS))).fetchall():
        out += order_fields(order_id, status, returned, exchanged, modified)
    return out


async def paid_twice(ctx: InvariantContext) -> list[str]:
    """No payment method that paid on a changed order was refunded more than it paid there (one payment
    refunded twice). In :data:`INVARIANTS`, on every order the change log names; the concurrency races
    check the same on their own rows (:func:`.concurrency.check_entities`)."""
    return await refunded_twice(ctx.conn, LOGGED_ORDERS)


async def item_matches_variant(ctx: InvariantContext) -> list[str]:
    """Each order item changed since the opening has its variant's price and options."""
    out = []
    for order_id, position, item_id, price, variant_price, same_options in await (
            await ctx.conn.execute(CHANGED_ITEMS)).fetchall():
        if variant_price is None:
            out.append(f"order {order_id} item {position}: {item_id} is no variant of its product")
            continue
        what = [f"price {_money(price)}, variant {_money(variant_price)}"] if price != variant_price else []
        what += ["other options than its variant's"] if not same_options else []
        out.append(f"order {order_id} item {position} ({item_id}): {'; '.join(what)}")
    return out


INVARIANTS = (
    Invariant("gift_card_balance", gift_card_balance,
              "each gift card's balance = opening + refunds - payments recorded on it"),
    Invariant("order_payments", order_payments,
              "each changed order's payment history agrees with its status"),
    Invariant("order_status_transition", order_status_transition,
              "status changes follow the order state machine"),
    Invariant("item_matches_variant", item_matches_variant,
              "every changed item has its variant's price and options"),
    Invariant("paid_twice", paid_twice,
              "no payment method refunded more on an order than it paid there"),
)


# --------------------------------------------------------------------------- scenarios

def call_id(task_id: str, action_id: str) -> str:
    """The tool call id of a golden action: ``tau2-<task>-<action_id>``."""
    return f"tau2-{task_id}-{action_id}"


def task_scenario(task: dict) -> Scenario:
    """One tau2 task as a scenario: each golden action one step of one planned call, in order.

    ``intended`` holds the task id and the golden actions' call ids (``tau2-<task>-<action_id>``)."""
    actions = (task.get("evaluation_criteria") or {}).get("actions") or []
    steps = tuple((PlannedCall(a["name"], dict(a["arguments"])),) for a in actions)
    instructions = (task.get("user_scenario") or {}).get("instructions") or {}
    prompt = instructions.get("reason_for_call") if isinstance(instructions, dict) else None
    return Scenario(
        f"tau2-{task['id']}", f"tau2 retail task {task['id']}", prompt or f"tau2 retail task {task['id']}",
        customers=(), steps=steps,
        intended={"task_id": str(task["id"]), "call_ids": tuple(call_id(str(task["id"]), a["action_id"]) for a in actions)},
        tenant_id=TENANT,
    )


SCENARIOS = {sc.name: sc for sc in map(task_scenario, read_tasks())}


async def create_rows(conn, scenario, schema: str) -> list[int]:
    """Nothing: a tau2 task acts on the seeded rows, on a database of its own."""
    return []


async def export_state(conn, ids: list[int]) -> dict:
    """The whole retail state in tau2's ``RetailDB`` JSON shape (``ids`` is unused)."""
    return await _export_state(conn)


def toolset(reproduce_last_variant_bug: bool | None = None) -> Toolset:
    """The 16 tools as a :class:`Toolset`; ``reproduce_last_variant_bug`` fixes the switch (None: the
    module-level :data:`agentlab.domains.retail.tools.reproduce_last_variant_bug`, read at call time)."""
    return Toolset(ToolSpec(name, model, handler, writes, description=doc)
                   for name, model, handler, writes, doc in specs(reproduce_last_variant_bug))


# what seed() reads (plain or packed): its bytes count in the template's fingerprint
SEED_FILES = tuple(p for p in (DATA_DIR / "db.json", DATA_DIR / "db.json.gz") if p.exists())


def retail_domain(*, reproduce_last_variant_bug: bool = True) -> Domain:
    """The retail domain, reproducing tau2's last-variant bug (default) or fixing it."""
    return Domain(
        "retail", toolset=toolset(reproduce_last_variant_bug), scenarios=SCENARIOS, create_rows=create_rows,
        schema="retail", migrations=MIGRATIONS, seed=seed, seed_files=SEED_FILES, invariants=INVARIANTS,
        export_state=export_state, tenant_id=TENANT, error_hints=ERROR_HINTS, shared_tables=SHARED_TABLES,
        races=CONCURRENCY,
        description="tau2-bench retail (a2c0247): 16 tools, 114 tasks' golden actions"
                    + ("" if reproduce_last_variant_bug else "; tau2's last-variant bug fixed"),
    )


DOMAIN = retail_domain()
DOMAIN_FIXED = retail_domain(reproduce_last_variant_bug=False)
