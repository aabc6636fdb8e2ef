"""Deliberately wrong, for the ladder: the first drafts a batch of tool calls goes through.

These are the rungs below ``savepoints`` in :data:`agentlab.core.safeguards.PRESETS`, kept so that an
experiment can show what the safe path buys. Nothing safe imports this module; only
:func:`agentlab.core.batch.choice.strategy_for` picks a draft, for safeguards that switch the
transaction or the savepoints off.

- :class:`AutocommitDraft` (no transaction): every statement commits on its own; a failing call leaves
  its siblings half applied.
- :class:`NoSavepointsDraft` (one transaction, no savepoints): each call is reported as it returns and
  the batch commits at the end; after a failure the database saw, PostgreSQL turns that COMMIT into a
  ROLLBACK (the "aborted transaction" trap, case C09), so calls reported applied are lost. The events
  table records it as ``commit_rolled_back``.
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg.pq import TransactionStatus

from agentlab.core.batch import ledger
from agentlab.core.batch.calls import Call
from agentlab.core.batch.opening import open_batch
from agentlab.core.batch.pipelined import end
from agentlab.core.batch.results import BatchEnd, CallResult, Outcome, Settled, failed
from agentlab.core.batch.savepoints import SavepointStrategy, rollback_quietly
from agentlab.core.batch.strategy import Batch
from agentlab.core.hooks import run_hooks
from agentlab.core.safeguards import Policy
from agentlab.core.schema import STRICT_SCHEMA

log = logging.getLogger(__name__)

SET_SEARCH_PATH = "SELECT set_config('search_path', %s, false)"
RESET_SEARCH_PATH = "RESET search_path"


async def run_call(conn, batch: Batch, c: Call, *, in_transaction: bool = True) -> CallResult:
    """Run ``c``'s handler (and its ledger row, with the ledger on) on ``conn`` with no savepoint: APPLIED
    or FAILED with its translated reason. An infrastructure error is raised."""
    await run_hooks(batch.hooks.before_call, c, c.index)
    t0, started_ns = time.perf_counter(), time.time_ns()
    try:
        result, content = await ledger.apply(conn, c, batch.context(c), ledger=batch.safeguards.ledger,
                                             attempt=batch.attempt, in_transaction=in_transaction)
    except Exception as exc:
        tr = batch.translate(exc, c)
        if tr.infrastructure:
            raise
        answer = failed(c.index, c.call_id, c.name, tr)
        answer.latency_ms, answer.started_ns = (time.perf_counter() - t0) * 1000, started_ns
        return answer
    return CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result,
                      latency_ms=(time.perf_counter() - t0) * 1000, started_ns=started_ns)


class NoSavepointsDraft:
    """Deliberately wrong, for the ladder: one transaction and no savepoints, reporting as it goes (C09)."""

    async def run(self, batch: Batch, calls: list[Call]) -> Settled:
        results: dict[int, CallResult] = {}
        stop = aborted = False
        async with batch.pool.connection() as conn:
            try:
                stored = await open_batch(conn, batch, calls)
                for c in calls:
                    replayed = ledger.from_ledger(c, stored.get(batch.key(c)))
                    if replayed is not None:
                        results[c.index] = replayed
                        if replayed.outcome is Outcome.FAILED and batch.safeguards.policy is Policy.ATOMIC:
                            stop = True
                            break
                        continue
                    result = results[c.index] = await run_call(conn, batch, c)  # reported as it goes: the trap
                    if result.outcome is Outcome.APPLIED:
                        await run_hooks(batch.hooks.after_call, c, c.index)
                    else:
                        aborted = True  # the transaction may be aborted; later calls then meet 25P02
                in_error = conn.info.transaction_status is TransactionStatus.INERROR
                commit_error = await end(conn, batch, stop)
            except BaseException:
                await rollback_quietly(conn)
                raise
        if commit_error is not None:
            return SavepointStrategy.commit_failed(batch, calls, results, commit_error)
        if aborted and in_error:
            batch.events.record("tools", "commit_rolled_back", thread_id=batch.thread_id, attempt=batch.attempt,
                                detail="COMMIT of an aborted transaction was turned into ROLLBACK")
        if stop or (aborted and in_error):
            return Settled(results, BatchEnd.ROLLED_BACK, rolled_back=True)
        # a failure the database never saw (a refused call, a tool's own error) leaves the transaction
        # usable and COMMIT keeps the other calls: the batch was not rolled back
        return Settled(results, BatchEnd.COMMITTED)


class AutocommitDraft:
    """Deliberately wrong, for the ladder: no transaction, every statement commits on its own."""

    async def run(self, batch: Batch, calls: list[Call]) -> Settled:
        sg = batch.safeguards
        results: dict[int, CallResult] = {}
        async with batch.pool.connection() as conn:
            if sg.schema != STRICT_SCHEMA:
                await conn.execute(SET_SEARCH_PATH, (f"{sg.schema}, public",))
            try:
                for c in calls:
                    result = results[c.index] = await run_call(conn, batch, c, in_transaction=False)
                    if result.outcome is Outcome.APPLIED:
                        await run_hooks(batch.hooks.after_call, c, c.index)
            finally:
                if sg.schema != STRICT_SCHEMA and not conn.closed:
                    try:
                        await conn.execute(RESET_SEARCH_PATH)
                    except psycopg.Error:
                        pass  # a broken connection is discarded by the pool
        return Settled(results, BatchEnd.COMMITTED)
