"""The reviewer's side of an approval, outside the graph: the requests a run stopped on, the resume that
answers them, and what was stored, read back.

- :func:`interrupts_of` / :func:`pending_requests`: the approval requests (the dicts that
  :meth:`agentlab.durable.approval.ApprovalPolicy.request` builds) a run returned or a thread's latest
  checkpoint waits on;
- :func:`resume_command`: the ``Command(resume=...)`` that answers them (the answer is read by
  :mod:`agentlab.durable.approval_answers`);
- :func:`approval_requests` / :func:`approval_decisions`: the ``approval_requests`` table as pandas
  DataFrames, one row per request, or one row per decided call.

Source: LangGraph docs "Interrupts" (``__interrupt__`` in a run's result, resuming with ``Command(resume=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.types import Command

LIST_DECISIONS = """
SELECT r.request_key, d.key AS tool_call_id, d.value->>'decision' AS decision, d.value->>'args_sha256' AS args_sha256,
       d.value->'args' AS args, d.value->>'message' AS message, r.decided_by, r.decided_at
FROM approval_requests r CROSS JOIN LATERAL jsonb_each(r.decision_details) d
WHERE r.status = 'decided' AND (%(thread)s::text IS NULL OR r.thread_id = %(thread)s)
ORDER BY r.decided_at, r.request_key, d.key
"""
LIST_REQUESTS = """
SELECT request_key, thread_id, node, step, calls, status, decisions, requested_at, decided_at
FROM approval_requests WHERE (%(thread)s::text IS NULL OR thread_id = %(thread)s) ORDER BY requested_at, request_key
"""


def interrupts_of(result: Mapping[str, Any] | None) -> list[dict]:
    """The approval requests a graph run stopped on (``result["__interrupt__"]`` values), or []."""
    return [i.value for i in (result or {}).get("__interrupt__", ()) or ()]


async def pending_requests(graph, config: dict) -> list[dict]:
    """The approval requests a checkpointed thread is waiting on, read from its latest checkpoint."""
    snapshot = await graph.aget_state(config)
    return [i.value for task in snapshot.tasks for i in task.interrupts]


def resume_command(decisions: Mapping[str, Any] | str, *, reviewer: str | None = None) -> Command:
    """``Command(resume=decisions)``: a mapping ``{tool_call_id: "approve" | "reject" | decision}`` (a
    decision: :func:`edit_call`, :func:`reject_call`) or one word for all. With ``reviewer`` (who decides,
    recorded in ``approval_requests.decided_by``) the value is ``{"decisions": ..., "reviewer": reviewer}``."""
    value = dict(decisions) if isinstance(decisions, Mapping) else decisions
    return Command(resume=value if reviewer is None else {"decisions": value, "reviewer": reviewer})


async def approval_requests(pool, thread_id: str | None = None):
    """The stored approval requests (one row per batch) as a pandas DataFrame, oldest first."""
    import pandas as pd

    async with pool.connection() as conn:
        rows = await (await conn.execute(LIST_REQUESTS, {"thread": thread_id})).fetchall()
    return pd.DataFrame(rows, columns=["request_key", "thread_id", "node", "step", "calls", "status", "decisions",
                                       "requested_at", "decided_at"])


async def approval_decisions(pool, thread_id: str | None = None):
    """The recorded decisions, one row per call, as a pandas DataFrame, oldest first: ``request_key``,
    ``tool_call_id``, ``decision`` (approve / edit / reject), ``args_sha256`` (of the call that runs, or was
    shown), ``args`` (edited ones), ``message`` (a rejection's reason), ``decided_by``, ``decided_at``."""
    import pandas as pd

    async with pool.connection() as conn:
        rows = await (await conn.execute(LIST_DECISIONS, {"thread": thread_id})).fetchall()
    return pd.DataFrame(rows, columns=["request_key", "tool_call_id", "decision", "args_sha256", "args", "message",
                                       "decided_by", "decided_at"])

