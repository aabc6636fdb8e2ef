"""Hand-written batches of tool calls: build one, run it on a tools node, show what came back.

A model sends a batch as the tool calls of one ``AIMessage``. Notebooks, exercises and tests often
want to send one by hand, without a scripted episode around it::

    calls = tool_calls(("CreateInvoice", {"customer_id": 1, "billing_period": "2026-05-01", "amount_cents": 1200}),
                       ("ApplyCredit", {"customer_id": 1, "amount_cents": 500}), prefix="nb05")
    batch = await h.node(preset("savepoints")).run_batch(calls, tenant_id="acme", thread_id="nb05-a")
    batch_frame(batch)          # one row per tool call: tool, outcome, category, message

Tool call ids are readable and fixed (``nb05-1``, ``nb05-2``, ...), so outputs are the same on every
run; a thread reusing an id meets the idempotency ledger (a replay), as a real retry would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from agentlab.core.schema import LAX_SCHEMA, STRICT_SCHEMA
from agentlab.domains.billing.scenarios import INSERT_CUSTOMER

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.core.batch import BatchResult
    from agentlab.core.safeguards import Safeguards

BATCH_COLUMNS = ("call", "tool", "outcome", "category", "message")
STEP_COLUMNS = ("step", "tool", "args", "outcome", "message")

CUSTOMER_ROWS = """
SELECT c.id AS customer_id, c.credit_cents,
       (SELECT count(*) FROM {s}.invoices i WHERE i.customer_id = c.id) AS invoices,
       (SELECT coalesce(string_agg(i.billing_period::text, ', ' ORDER BY i.id), '')
          FROM {s}.invoices i WHERE i.customer_id = c.id) AS billing_periods,
       (SELECT count(*) FROM {s}.credit_memos m WHERE m.customer_id = c.id) AS credit_memos,
       (SELECT count(*) FROM {s}.refunds r WHERE r.customer_id = c.id) AS refunds
FROM {s}.customers c WHERE c.id = ANY(%s)
"""


def tool_calls(*calls: tuple[str, Mapping[str, Any]], prefix: str = "call") -> list[dict]:
    """Tool calls in the shape of ``AIMessage.tool_calls``: ``{"name", "args", "id", "type"}``.

    Args:
        calls: ``(tool name, arguments)`` pairs, in the order the model sends them. The arguments
            are passed as given (LLM-shaped values included); nothing is checked here.
        prefix: the ids are ``f"{prefix}-{n}"``, numbered from 1.
    """
    return [{"name": name, "args": dict(args), "id": f"{prefix}-{n}", "type": "tool_call"}
            for n, (name, args) in enumerate(calls, 1)]


def batch_frame(batch: BatchResult, calls: Sequence[Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """One row per tool call of ``batch``, in call order: call id, tool, outcome, category and the
    ToolMessage text the model receives (columns :data:`BATCH_COLUMNS`). Given the ``calls`` that
    were sent, an ``args`` column shows each call's arguments as JSON text (LLM-shaped values as sent)."""
    import pandas as pd

    rows = [(r.call_id, r.tool, r.outcome.value, r.category or "", r.content) for r in batch.results]
    frame = pd.DataFrame(rows, columns=list(BATCH_COLUMNS))
    if calls is not None:
        sent = {c["id"]: json.dumps(c.get("args"), default=str) for c in calls}
        frame.insert(2, "args", [sent.get(r.call_id, "") for r in batch.results])
    return frame


def steps_frame(messages: Sequence[Any]) -> pd.DataFrame:
    """One row per tool call of an episode's ``messages``: the batch it was sent in (from 1), the
    tool, its arguments, its outcome and the reply the model read (columns :data:`STEP_COLUMNS`)."""
    import pandas as pd

    from agentlab.core.messages import steps

    rows = [(n, c["tool"], c["args"], c["outcome"], c["reply"])
            for n, step in enumerate(steps(list(messages)), 1) for c in step["calls"]]
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


INSERT_CUSTOMER_WITH_ID = "INSERT INTO {schema}.customers (id, tenant_id, name, credit_cents) VALUES (%s, %s, %s, %s)"


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
