"""The idempotency ledger (``tool_executions``): one row per applied call, written in the call's savepoint.

A call's key is :func:`idempotency_key`. Before a batch runs, one look-up reads the rows of all its keys
(:data:`LEDGER_LOOKUP_WITH_ARGS`, sent by :mod:`agentlab.core.batch.opening`); a call whose row exists is
answered from it (:func:`from_ledger`) instead of running again: a node retry, a resume after a crash, a
replay of a checkpoint. :func:`apply` runs a call's handler and inserts its row on the same connection, so
the row commits exactly with the call's writes.

Sources: DBOS Transact (a step's output recorded in the transaction of its effect); Stripe "Idempotent
requests".
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.pq import TransactionStatus

from agentlab.core.batch.budgets import Spend, spend_calls
from agentlab.core.batch.calls import Call
from agentlab.core.batch.guard import ENDS_TRANSACTION, GuardedConnection, HandlerContractViolation
from agentlab.core.batch.results import CallResult, Outcome, failed
from agentlab.core.batch.timeouts import SET_STATEMENT_TIMEOUT, budget
from agentlab.core.errors import Category, ToolError, translate
from agentlab.core.messages import LEDGER_ARGS_MISMATCH
from agentlab.core.toolspec import ToolContext, result_content

LEDGER_LOOKUP = "SELECT idempotency_key, result FROM tool_executions WHERE idempotency_key = ANY(%s)"
LEDGER_LOOKUP_WITH_ARGS = (
    "SELECT idempotency_key, args, result FROM tool_executions WHERE idempotency_key = ANY(%s)"
)
LEDGER_INSERT = """
INSERT INTO tool_executions (idempotency_key, tenant_id, thread_id, tool_call_id, occurrence, tool_name, args, result,
                             attempt)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def idempotency_key(thread_id: str, tool_call_id: str, *, tenant_id: str | None = None, occurrence: int = 0) -> str:
    """The ledger key of a tool call: the JSON array ``[tenant_id, thread_id, tool_call_id, occurrence]``.

    Each part is a JSON value, so no two different calls share a key whatever their ids hold (a thread
    ``support-7`` with call ``x:1`` and a thread ``support-7:x`` with call ``1`` do not collide, case
    C34), and the tenant is part of it (None without isolation). ``occurrence`` is how many earlier
    AIMessages of the thread hold the same call id (:func:`agentlab.core.messages.occurrences`): 0 for
    every model that sends fresh ids; a model that reuses one id on every turn (case C17) gets a new key
    per turn, while a node retry, a resume or a replay of the same turn gets the same key again.
    The text equals PostgreSQL's ``jsonb_build_array(...)::text`` for the same parts (the migration
    re-keys older rows with it).
    """
    return json.dumps([tenant_id, thread_id, tool_call_id, occurrence], ensure_ascii=False)


def key_of(c: Call, thread_id: str, tenant_id: str | None) -> str:
    """The ledger key of ``c`` in ``thread_id`` for ``tenant_id``."""
    return idempotency_key(thread_id, c.call_id, tenant_id=tenant_id, occurrence=c.occurrence)


def as_json(value: Any) -> Any:
    """``value`` as the ledger's JSONB gives it back (dates as ISO text), for comparing arguments."""
    return json.loads(json.dumps(value, default=str))


def from_ledger(c: Call, stored: tuple | None) -> CallResult | None:
    """The answer the ledger gives for ``c``: its stored result (REPLAYED), FAILED [conflict] when the
    stored arguments differ (an edited fork: the earlier call stands), or None when it has no row.
    ``stored`` is the ``(args, result)`` pair the look-up read for ``c``'s key."""
    if stored is None:
        return None
    stored_args, stored_result = stored
    if stored_args != as_json(c.args):
        return failed(c.index, c.call_id, c.name, translate(ToolError(LEDGER_ARGS_MISMATCH, Category.CONFLICT)))
    return CallResult(c.index, c.call_id, c.name, Outcome.REPLAYED, result_content(stored_result), result=stored_result)


async def apply(conn, c: Call, ctx: ToolContext, *, ledger: bool, attempt: int,
                in_transaction: bool = True, spend: Spend | None = None) -> tuple[dict, str]:
    """Run ``c``'s handler on ``conn`` (guarded: :mod:`agentlab.core.batch.guard`) and, with ``ledger``,
    insert its ledger row there too. A tool with a time budget runs under it, and the batch's
    ``statement_timeout`` is restored before the ledger row (:mod:`agentlab.core.batch.timeouts`). With
    ``spend`` the call first spends its tool-call budgets (:mod:`agentlab.core.batch.budgets`).

    Returns the handler's result and its JSON text (the ToolMessage content and the stored result).

    Raises:
        HandlerContractViolation: the handler broke the contract, refused before the statement was sent,
            or, ``in_transaction``, found afterwards: the batch's transaction is no longer open.
        BudgetSpent: a budget of ``spend`` had no room (before the handler ran).
        Exception: whatever the handler or the INSERT raised.
    """
    if spend is not None and in_transaction:
        await spend_calls(conn, spend)
    timeout = budget(c.spec, ctx.safeguards) if in_transaction else None
    if timeout is not None:
        await conn.execute(SET_STATEMENT_TIMEOUT, (timeout.call,))
    result = await c.spec.handler(GuardedConnection(conn, c.name), c.args, ctx)
    if in_transaction and conn.info.transaction_status is TransactionStatus.IDLE:  # known outside a pipeline
        raise HandlerContractViolation(c.name, ENDS_TRANSACTION)
    if timeout is not None:
        await conn.execute(SET_STATEMENT_TIMEOUT, (timeout.batch,))
    content = result_content(result)
    if ledger:
        await conn.execute(LEDGER_INSERT, (
            key_of(c, ctx.thread_id, ctx.tenant_id), ctx.tenant_id, ctx.thread_id, c.call_id, c.occurrence, c.name,
            json.dumps(c.args, default=str), content, attempt,
        ))
    return result, content
