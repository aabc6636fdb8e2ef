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

from agentlab.domains.billing.scenarios import INSERT_CUSTOMER

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.core.tools_node import BatchResult

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


def batch_frame(batch: "BatchResult", calls: Sequence[Mapping[str, Any]] | None = None) -> "pd.DataFrame":
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


def steps_frame(messages: Sequence[Any]) -> "pd.DataFrame":
    """One row per tool call of an episode's ``messages``: the batch it was sent in (from 1), the
    tool, its arguments, its outcome and the reply the model read (columns :data:`STEP_COLUMNS`)."""
    import pandas as pd

    from agentlab.core.messages import steps

    rows = [(n, c["tool"], c["args"], c["outcome"], c["reply"])
            for n, step in enumerate(steps(list(messages)), 1) for c in step["calls"]]
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


async def new_customer(h, credit_cents: int = 5000, *, schema: str = "public", tenant_id: str = "acme",
                       name: str = "Workshop customer") -> int:
    """Insert one customer with ``credit_cents`` of store credit into ``schema`` (``public``, the
    constrained tables, or ``lax``, the copies without constraints); return its id.

    ``h`` is a :class:`agentlab.runtime.harness.Harness` (its business pool is used).
    """
    query = sql.SQL(INSERT_CUSTOMER).format(schema=sql.Identifier(schema))
    async with h.pool.connection() as conn:
        cur = await conn.execute(query, (tenant_id, name, credit_cents))
        return (await cur.fetchone())[0]


async def customer_rows(h, customer_ids: Iterable[int], *, schema: str = "public") -> "pd.DataFrame":
    """What ``schema`` holds for ``customer_ids``, one row each in the order given: ``customer_id``,
    ``credit_cents``, ``invoices`` (count), ``billing_periods`` (ISO dates, comma-separated),
    ``credit_memos`` and ``refunds`` (counts). Read from the database, never from the code's bookkeeping."""
    ids = list(customer_ids)
    frame = await h.df(sql.SQL(CUSTOMER_ROWS).format(s=sql.Identifier(schema)), (ids,))
    order = {cid: n for n, cid in enumerate(ids)}
    return frame.sort_values("customer_id", key=lambda col: col.map(order)).reset_index(drop=True)
