"""The reference path: one transaction per batch, a savepoint per tool call. Take this one home.

Read it beside notebook 05::

    BEGIN; settings, the thread's lock, the ledger look-up      (opening.open_batch)
    for each call:
        answered by the ledger?  -> its stored result (REPLAYED), no SQL
        SAVEPOINT tool_call      (psycopg's nested conn.transaction())
            the tool's statements; its ledger row
            (a tool with a time budget: SET LOCAL statement_timeout around its statements, timeouts.py)
        RELEASE                  or, on an error, ROLLBACK TO tool_call: this call alone is undone
        atomic policy and the call failed -> ROLLBACK, stop
    COMMIT
    only now is any call reported APPLIED (case C12: COMMIT itself may fail)

A failed call is answered with the translator's sanitized reason; its siblings, under the atomic
policy, NOT APPLIED; the node answers every call id. An infrastructure error (a lost connection, a busy
lock: :func:`agentlab.core.errors.is_infrastructure`) rolls back and is raised for the graph's RetryPolicy.

:mod:`agentlab.core.batch.pipelined` sends the same statements in fewer round trips; a differential test
holds the two equal.

Sources: PostgreSQL docs "SAVEPOINT", "ROLLBACK TO SAVEPOINT"; psycopg docs "Transactions management"
(nested transaction blocks).
"""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from agentlab.core.batch import ledger
from agentlab.core.batch.calls import Call
from agentlab.core.batch.opening import COMMIT, ROLLBACK, open_batch
from agentlab.core.batch.results import BatchEnd, CallResult, Outcome, Settled, commit_failed, failed, not_applied
from agentlab.core.batch.strategy import Batch
from agentlab.core.errors import Translation, is_infrastructure
from agentlab.core.hooks import run_hooks
from agentlab.core.messages import BATCH_ROLLED_BACK
from agentlab.core.safeguards import Policy
from agentlab.core.toolspec import result_content

log = logging.getLogger(__name__)

SAVEPOINT_NAME = "tool_call"  # one call's savepoint is open at a time
ROLLBACK_TO_SAVEPOINT = sql.SQL("ROLLBACK TO {}").format(sql.Identifier(SAVEPOINT_NAME))
RELEASE_SAVEPOINT = sql.SQL("RELEASE {}").format(sql.Identifier(SAVEPOINT_NAME))


class SavepointStrategy:
    """One transaction, a savepoint per call, nothing reported applied before COMMIT returned."""

    async def run(self, batch: Batch, calls: list[Call]) -> Settled:
        atomic = batch.safeguards.policy is Policy.ATOMIC
        results: dict[int, CallResult] = {}
        applied: dict[int, CallResult] = {}  # ran and released; stored once COMMIT returns
        stop = False
        async with batch.pool.connection() as conn:
            try:
                stored = await open_batch(conn, batch, calls)
                for c in calls:
                    result = ledger.from_ledger(c, stored.get(batch.key(c))) or await self.call(conn, batch, c)
                    if conn.info.transaction_status is TransactionStatus.IDLE:  # a handler got past the guard
                        return await self.transaction_ended(conn, batch, calls, {**results, c.index: result})
                    if result.outcome is Outcome.APPLIED:
                        applied[c.index] = result
                        await run_hooks(batch.hooks.after_call, c, c.index)
                        continue
                    results[c.index] = result
                    if result.outcome is Outcome.FAILED and atomic:
                        stop = True
                        break
                try:
                    await conn.execute(ROLLBACK if stop else COMMIT)
                except psycopg.Error as exc:  # a deferred constraint fails at COMMIT: nothing is stored
                    tr = batch.translate(exc)
                    if tr.infrastructure:
                        raise
                    return self.commit_failed(batch, calls, {**results, **applied}, tr)
            except BaseException:
                await rollback_quietly(conn)
                raise
        if stop:
            results.update({i: r.undone(BATCH_ROLLED_BACK) for i, r in applied.items()})
            return Settled(results, BatchEnd.ROLLED_BACK, rolled_back=True)
        return Settled({**results, **applied}, BatchEnd.COMMITTED)

    async def call(self, conn, batch: Batch, c: Call) -> CallResult:
        """Run ``c`` and its ledger row in a savepoint of its own: APPLIED (not yet committed) or FAILED,
        with this call alone undone. Raises an infrastructure error as it came."""
        await run_hooks(batch.hooks.before_call, c, c.index)
        t0, started_ns = time.perf_counter(), time.time_ns()
        try:
            async with conn.transaction(savepoint_name=SAVEPOINT_NAME):
                result, content = await ledger.apply(conn, c, batch.context(c), ledger=batch.safeguards.ledger,
                                                     attempt=batch.attempt, spend=batch.spend(c))
        except Exception as exc:
            if conn.broken or is_infrastructure(exc):
                raise
            await undo_if_aborted(conn)
            answer = failed(c.index, c.call_id, c.name, batch.translate(exc, c))
            answer.latency_ms, answer.started_ns = (time.perf_counter() - t0) * 1000, started_ns
            return answer
        return CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result,
                          latency_ms=(time.perf_counter() - t0) * 1000, started_ns=started_ns)

    @staticmethod
    async def transaction_ended(conn, batch: Batch, calls: list[Call], results: dict[int, CallResult]) -> Settled:
        """A handler ended the batch's transaction behind the guard's back (the call is already FAILED):
        what is stored is what the ledger holds now, read on the same connection; the rest is NOT APPLIED."""
        keys = {batch.key(c): c for c in calls}
        cur = await conn.execute(ledger.LEDGER_LOOKUP, (list(keys),)) if batch.safeguards.ledger else None
        stored = {k: r for k, r in await cur.fetchall()} if cur is not None else {}
        for key, c in keys.items():
            earlier = results.get(c.index)
            if earlier is not None and earlier.outcome is Outcome.REPLAYED:
                continue
            if key in stored:  # committed with its ledger row by the handler's COMMIT
                results[c.index] = CallResult(c.index, c.call_id, c.name, Outcome.APPLIED,
                                              result_content(stored[key]), result=stored[key])
            elif earlier is None or earlier.outcome is Outcome.APPLIED:
                results[c.index] = not_applied(c.index, c.call_id, c.name, BATCH_ROLLED_BACK)
        return Settled(results, BatchEnd.ROLLED_BACK, rolled_back=not stored)

    @staticmethod
    def commit_failed(batch: Batch, calls: list[Call], results: dict[int, CallResult], tr: Translation) -> Settled:
        """The server rolled the whole batch back at COMMIT: no call of it is applied (``results``: what each
        call had become before COMMIT)."""
        batch.record_commit_failed(tr)
        for c in calls:
            if c.index not in results or results[c.index].outcome is Outcome.APPLIED:
                results[c.index] = commit_failed(c.index, c.call_id, c.name, tr)
        return Settled(results, BatchEnd.COMMIT_FAILED, rolled_back=True)


async def undo_if_aborted(conn) -> None:
    """psycopg rolls a failed block back to its savepoint; a tool that caught its own statement's error
    leaves the transaction aborted and the block's RELEASE fails: undo the savepoint here too."""
    if conn.info.transaction_status is not TransactionStatus.INERROR:
        return
    try:
        await conn.execute(ROLLBACK_TO_SAVEPOINT)
        await conn.execute(RELEASE_SAVEPOINT)
    except psycopg.Error as exc:
        if conn.broken or is_infrastructure(exc):
            raise
        log.warning("ROLLBACK TO the failed call's savepoint failed: %s", exc)


async def rollback_quietly(conn) -> None:
    """End the batch's transaction after an exception (the exception is what the caller sees): ROLLBACK
    when the connection is still in one; a broken connection is discarded by the pool."""
    if conn.closed or conn.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    try:
        await conn.execute(ROLLBACK)
    except psycopg.Error as exc:
        log.warning("ROLLBACK after a failed batch failed too: %s", exc)
