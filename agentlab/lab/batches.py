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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentlab.domains.billing.rows import (  # noqa: F401 (billing's helpers, moved there; importable here as before)
    CUSTOMER_ROWS,
    INSERT_CUSTOMER_WITH_ID,
    customer_rows,
    new_customer,
    schema_for,
)

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.core.batch import BatchResult

BATCH_COLUMNS = ("call", "tool", "outcome", "category", "message")
STEP_COLUMNS = ("step", "tool", "args", "outcome", "message")

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
