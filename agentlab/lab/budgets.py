"""A tool-call budget kept in graph state against one kept in the database: how many calls get through.

LangChain's call-limit middleware keeps its counts in the graph's state: a run reads the count from its
checkpoint, refuses the calls beyond the limit before they run, and writes the new count with the node's
output. Two things the checkpoint cannot see let calls through:

- **two runs at once** on one thread both start from the same checkpoint, so each sees the whole budget;
- **a crash after COMMIT, before the checkpoint**: the calls are stored but the new count is not, and the
  run restarted from the last checkpoint (the model asked again, with new calls) sees the old count.

The kit's budget (:mod:`agentlab.core.batch.budgets`) is a row spent in the batch's transaction: it commits
with the calls it counts, and the second run waits for the first's row lock, then sees its count.
:func:`compare_budgets` plays both situations with each budget on one thread of ``ApplyCredit`` calls and
counts, in the ledger, the calls that were applied.
"""

from __future__ import annotations

import asyncio
import uuid

from agentlab.core.batch import CallBudgets, Outcome, TransactionalToolsNode
from agentlab.core.errors import SimulatedCrash
from agentlab.core.safeguards import Policy, preset

GRAPH_STATE, DATABASE = "graph state", "database"
TWO_RUNS, CRASH_AND_RESUME = "two runs at once", "crash and resume"
SEED = "INSERT INTO customers (tenant_id, name, credit_cents) VALUES (%s, 'Budget demo', 1000000) RETURNING id"
APPLIED = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"
STATE_LIMIT_REASON = "FAILED [budget]: the thread's limit of {limit} tool calls is reached (counted in graph state)."


def _calls(customer: int, tag: str, n: int) -> list[dict]:
    return [{"name": "ApplyCredit", "args": {"customer_id": customer, "amount_cents": 100}, "id": f"{tag}-{i}"}
            for i in range(n)]


class StateBudget:
    """The count kept in graph state: read from the checkpoint a run starts from, checked before the batch
    runs (the calls beyond the limit never run), saved with the node's output, unless the process dies first."""

    def __init__(self, node: TransactionalToolsNode, limit: int):
        self.node, self.limit = node, limit

    async def run(self, calls: list[dict], *, thread_id: str, tenant_id: str, count: int) -> int:
        """Run ``calls`` with ``count`` calls already spent (as the checkpoint says); return the new count."""
        allowed = calls[:max(0, self.limit - count)]
        batch = await self.node.run_batch(allowed, thread_id=thread_id, tenant_id=tenant_id)
        return count + sum(r.outcome is Outcome.APPLIED for r in batch.results)


async def compare_budgets(h, *, limit: int = 3, tenant_id: str = "acme") -> dict[str, dict[str, int]]:
    """How many calls got through a thread budget of ``limit`` calls, kept in graph state or in the database.

    ``h`` is a :class:`agentlab.runtime.harness.Harness` on the billing domain. Each situation runs on a new
    thread: two runs at once, each asking for ``limit`` calls; a run of ``limit`` calls that dies after COMMIT,
    before its checkpoint, then restarted from that checkpoint asking for ``limit`` new calls.

    Returns ``{situation: {"graph state": applied calls, "database": applied calls, "limit": limit}}``, the
    applied calls counted in the ledger (``tool_executions``).
    """
    sg = preset("full").replace(policy=Policy.PARTIAL)
    async with h.pool.connection() as conn:
        customer = (await (await conn.execute(SEED, (tenant_id,))).fetchone())[0]

    def node(budgets: CallBudgets | None) -> TransactionalToolsNode:
        return TransactionalToolsNode(h.pool, sg, toolset=h.toolset, provider=h.provider, events=h.events,
                                      error_hints=h.domain.error_hints, call_budgets=budgets)

    def crash_after_commit(n: TransactionalToolsNode) -> None:
        def die(calls):
            n.hooks.after_commit.remove(die)
            raise SimulatedCrash("the process died after COMMIT, before the checkpoint")
        n.hooks.after_commit.append(die)

    out: dict[str, dict[str, int]] = {TWO_RUNS: {"limit": limit}, CRASH_AND_RESUME: {"limit": limit}}
    for kind in (GRAPH_STATE, DATABASE):
        budgets = CallBudgets(per_thread=limit) if kind == DATABASE else None

        async def run(n: TransactionalToolsNode, calls: list[dict], thread: str, count: int = 0,
                      kind: str = kind) -> int:
            if kind == GRAPH_STATE:
                return await StateBudget(n, limit).run(calls, thread_id=thread, tenant_id=tenant_id, count=count)
            await n.run_batch(calls, thread_id=thread, tenant_id=tenant_id)
            return count

        thread = f"budget-two-{uuid.uuid4().hex[:8]}"
        await asyncio.gather(*(run(node(budgets), _calls(customer, tag, limit), thread) for tag in ("r1", "r2")))
        out[TWO_RUNS][kind] = await _applied(h, thread)

        thread = f"budget-crash-{uuid.uuid4().hex[:8]}"
        first = node(budgets)
        crash_after_commit(first)
        try:
            await run(first, _calls(customer, "before", limit), thread)
        except SimulatedCrash:
            pass  # the count the node would have saved is lost with the process
        await run(node(budgets), _calls(customer, "after", limit), thread, count=0)  # from the last checkpoint
        out[CRASH_AND_RESUME][kind] = await _applied(h, thread)
    return out


async def _applied(h, thread: str) -> int:
    async with h.pool.connection() as conn:
        return (await (await conn.execute(APPLIED, (thread,))).fetchone())[0]
