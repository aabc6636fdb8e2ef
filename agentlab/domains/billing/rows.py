"""Billing's customers as a notebook and the lab's results show them: one new customer (in ``public``, the lax
copy or both, under one id), and each customer's credit and record counts read back, with its payments at the
provider for a lab result (:data:`agentlab.domains.billing.DOMAIN`'s ``episode_rows``).

The helpers :func:`new_customer` and :func:`customer_rows` take a harness (``h.pool``, ``h.df``); they are the
workshop's (``agentlab.new_customer``), moved here from :mod:`agentlab.lab.batches`, where they stay importable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from psycopg import sql
from psycopg.rows import dict_row

from agentlab.core.outbox import customer_ref
from agentlab.core.schema import LAX_SCHEMA, STRICT_SCHEMA
from agentlab.domains.billing.scenarios import INSERT_CUSTOMER

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.core.safeguards import Safeguards

CUSTOMER_ROWS = """
SELECT c.id AS customer_id, c.credit_cents,
       (SELECT count(*) FROM {s}.invoices i WHERE i.customer_id = c.id) AS invoices,
       (SELECT coalesce(string_agg(i.billing_period::text, ', ' ORDER BY i.id), '')
          FROM {s}.invoices i WHERE i.customer_id = c.id) AS billing_periods,
       (SELECT count(*) FROM {s}.credit_memos m WHERE m.customer_id = c.id) AS credit_memos,
       (SELECT count(*) FROM {s}.refunds r WHERE r.customer_id = c.id) AS refunds
FROM {s}.customers c WHERE c.id = ANY(%s)
"""
INSERT_CUSTOMER_WITH_ID = "INSERT INTO {schema}.customers (id, tenant_id, name, credit_cents) VALUES (%s, %s, %s, %s)"
PAYMENTS = """
SELECT customer, count(*) FILTER (WHERE kind = 'charge') AS provider_charges,
       count(*) FILTER (WHERE kind = 'refund') AS provider_refunds
FROM provider.payments WHERE customer = ANY(%s) GROUP BY customer
"""


def schema_for(preset: Safeguards | str | None = None, schema: str | None = None) -> str | None:
    """The schema a helper writes to or reads from: ``preset``'s (``public`` with constraints, ``lax``
    without), or ``schema``; None when neither is given.

    Raises:
        ValueError: both are given and ``schema`` is not the one ``preset``'s tools work on, or
            ``schema`` is neither ``public`` nor ``lax``.
    """
    from agentlab.core.safeguards import preset as named_preset

    if schema is not None and schema not in (STRICT_SCHEMA, LAX_SCHEMA):
        raise ValueError(f"schema must be {STRICT_SCHEMA!r} or {LAX_SCHEMA!r}, not {schema!r}")
    if preset is None:
        return schema
    sg = named_preset(preset) if isinstance(preset, str) else preset
    if schema is not None and schema != sg.schema:
        raise ValueError(f"preset {sg.name!r} works on the schema {sg.schema!r}; schema={schema!r} would put the "
                         f"rows where its tools do not look (pass only preset=)")
    return sg.schema


async def new_customer(h, credit_cents: int = 5000, *, preset: Safeguards | str | None = None,
                       schema: str | None = None, tenant_id: str = "acme", name: str = "Workshop customer") -> int:
    """Insert one customer with ``credit_cents`` of store credit where the tools will look; return its id.

    With ``preset`` (a :class:`agentlab.core.safeguards.Safeguards` or its name), the row goes to
    the schema that preset's tools work on (``lax`` for the presets without constraints, else
    ``public``); with ``schema``, to that one. With neither, the same customer (one id: both schemas
    share one id sequence) is inserted into both, so a batch under any preset finds it; each preset's
    batches then change only its own copy (read it back with :func:`customer_rows` and the same
    ``preset``). ``h`` is a :class:`agentlab.runtime.harness.Harness` (its business pool is used).

    Raises:
        ValueError: ``preset`` and ``schema`` disagree (the message names both schemas).
        psycopg.errors.CheckViolation: a negative ``credit_cents`` into ``public`` (its CHECK).
    """
    target = schema_for(preset, schema)
    first = target or STRICT_SCHEMA
    async with h.pool.connection() as conn, conn.transaction():
        cur = await conn.execute(sql.SQL(INSERT_CUSTOMER).format(schema=sql.Identifier(first)),
                                 (tenant_id, name, credit_cents))
        customer_id = (await cur.fetchone())[0]
        if target is None:
            await conn.execute(sql.SQL(INSERT_CUSTOMER_WITH_ID).format(schema=sql.Identifier(LAX_SCHEMA)),
                               (customer_id, tenant_id, name, credit_cents))
    return customer_id


async def customer_rows(h, customer_ids: Iterable[int], *, schema: str | None = None,
                        preset: Safeguards | str | None = None) -> pd.DataFrame:
    """What ``preset``'s schema (or ``schema``; default ``public``) holds for ``customer_ids``, one row
    each in the order given: ``customer_id``,
    ``credit_cents``, ``invoices`` (count), ``billing_periods`` (ISO dates, comma-separated),
    ``credit_memos`` and ``refunds`` (counts). Read from the database, never from the code's bookkeeping."""
    ids = list(customer_ids)
    schema = schema_for(preset, schema) or STRICT_SCHEMA
    frame = await h.df(sql.SQL(CUSTOMER_ROWS).format(s=sql.Identifier(schema)), (ids,))
    order = {cid: n for n, cid in enumerate(ids)}
    return frame.sort_values("customer_id", key=lambda col: col.map(order)).reset_index(drop=True)


async def episode_rows(conn, ids: list[int], schema: str) -> list[dict]:
    """Billing's ``episode_rows`` (:class:`agentlab.core.domain.Domain`): each of the customers ``ids`` in
    ``schema``, in that order, with the columns of :func:`customer_rows` and its payments at the provider
    (``provider_charges``, ``provider_refunds``), read on ``conn`` (an async connection)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL(CUSTOMER_ROWS).format(s=sql.Identifier(schema)), (list(ids),))
    by_id = {row["customer_id"]: row for row in await cur.fetchall()}
    paid = {customer: (charges, refunds) for customer, charges, refunds in
            await (await conn.execute(PAYMENTS, ([customer_ref(c) for c in ids],))).fetchall()}
    return [{**by_id[c], "provider_charges": int(paid.get(customer_ref(c), (0, 0))[0]),
             "provider_refunds": int(paid.get(customer_ref(c), (0, 0))[1])} for c in ids if c in by_id]
