"""The reference path's statements in one pipeline: an optimisation, held equal to the reference.

:class:`PipelinedStrategy` sends what :class:`agentlab.core.batch.savepoints.SavepointStrategy` sends (the
same SAVEPOINT, time budget, tool statements, ledger row and RELEASE per call, in the same order), in psycopg's
pipeline mode: the SAVEPOINT goes out with the tool's first statement, and a call's ledger row and RELEASE
go out with the next call's SAVEPOINT and first statement (the last call's, with COMMIT, in the batch's
Sync). A one-statement tool costs one round trip and the batch two more, to open and to commit: the
refund story's three calls take 6 round trips, against 18 on the reference path
(``python -m agentlab bench`` prints both). ``tests/core/test_pipelined_equals_reference.py`` runs the
suite's hostile batches through both and compares every answer and every row.

What makes it longer than the reference: in a pipeline the server skips every statement after an error
up to the next Sync, and psycopg raises the error to whichever statement's result is read first. So a
call's outcome is settled only once its RELEASE is answered: a call whose ledger row or RELEASE failed is
undone and answered FAILED, and the next call, whose statements the server skipped, runs again from the
start (:mod:`agentlab.core.batch.pipeline` keeps these mechanics).

Sources: PostgreSQL docs "Frontend/Backend Protocol: Pipelining"; libpq "Pipeline Mode"; psycopg docs
"Pipeline mode support".
"""

from __future__ import annotations

import time

import psycopg
from psycopg.pq import TransactionStatus

from agentlab.core.batch import ledger
from agentlab.core.batch.calls import Call
from agentlab.core.batch.opening import COMMIT, ROLLBACK, open_batch
from agentlab.core.batch.pipeline import (
    SAVEPOINT,
    FatalNotice,
    Pipeline,
    Step,
    Unanswered,
    aborted,
    lost,
    rollback_quietly,
    undo_savepoint,
)
from agentlab.core.batch.results import BatchEnd, CallResult, Outcome, Settled, failed
from agentlab.core.batch.savepoints import RELEASE_SAVEPOINT, SavepointStrategy
from agentlab.core.batch.strategy import Batch
from agentlab.core.errors import Translation, is_infrastructure
from agentlab.core.hooks import run_hooks
from agentlab.core.messages import BATCH_ROLLED_BACK
from agentlab.core.safeguards import Policy

UNKNOWN_EARLIER_ERROR = ("a statement of this call sent after its tool returned failed (its ledger row, its RELEASE "
                         "or a statement whose result the tool did not read); the next call's tool caught the "
                         "server's error")


class PipelinedStrategy:
    """One transaction, a savepoint per call, the calls sharing one pipeline. No fold around a hook
    (``before_call``, ``after_call``): a hook sees the batch between calls, every statement sent so far
    answered."""

    async def run(self, batch: Batch, calls: list[Call]) -> Settled:
        atomic = batch.safeguards.policy is Policy.ATOMIC
        results: dict[int, CallResult] = {}
        pending: dict[int, CallResult] = {}  # applied, reported once COMMIT returned

        async def settle(c: Call, result: CallResult) -> bool:
            """Record ``c``'s outcome; True when it ends the batch (a failure under the atomic policy)."""
            if result.outcome is Outcome.APPLIED:
                pending[c.index] = result
                await run_hooks(batch.hooks.after_call, c, c.index)
                return False
            results[c.index] = result
            return result.outcome is Outcome.FAILED and atomic

        async with batch.pool.connection() as conn:
            fatal = FatalNotice()  # in a pipeline, a terminated backend's last words arrive as a notice
            conn.add_notice_handler(fatal)
            pipe = Pipeline(conn)
            try:
                stored = await open_batch(conn, batch, calls)
                stop, commit_error = await self.run_calls(conn, pipe, batch, calls, stored, settle)
            except BaseException as exc:
                await pipe.sync()  # a lost connection's error is the one raised below
                await rollback_quietly(conn)
                if isinstance(exc, Exception) and (gone := lost(conn, exc, fatal)) is not None:
                    raise gone from exc
                raise
            finally:
                conn.remove_notice_handler(fatal)
        if commit_error is not None:
            return SavepointStrategy.commit_failed(batch, calls, {**results, **pending}, commit_error)
        if stop:
            results.update({i: r.undone(BATCH_ROLLED_BACK) for i, r in pending.items()})
            return Settled(results, BatchEnd.ROLLED_BACK, rolled_back=True)
        return Settled({**results, **pending}, BatchEnd.COMMITTED)

    async def run_calls(self, conn, pipe: Pipeline, batch: Batch, calls: list[Call], stored: dict[str, tuple],
                        settle) -> tuple[bool, Translation | None]:
        """Run ``calls`` in the pipeline, settling each with ``settle`` (True: the batch stops), and end the
        transaction. Returns whether the batch stopped, and COMMIT's translated error when it failed."""
        fold = not batch.hooks.before_call and not batch.hooks.after_call
        stop = False
        ended: BatchEnd | None = None  # how the COMMIT sent with the last call ended
        commit_error: Translation | None = None
        earlier: Unanswered | None = None  # a call whose ledger row and RELEASE await their answers
        for pos, c in enumerate(calls):
            result = ledger.from_ledger(c, stored.get(batch.key(c)))
            if result is None:
                last = pos == len(calls) - 1
                commit = last and not batch.hooks.after_call  # the last round trip carries COMMIT
                while True:
                    step = await self.call(conn, pipe, batch, c, commit=commit, fold=fold and not last, earlier=earlier)
                    if earlier is not None:
                        stop, earlier = await settle(earlier.call, step.earlier), None
                    if stop or not step.again:
                        break
                if stop:
                    break
                if step.unanswered is not None:
                    earlier = step.unanswered  # settled with the next call's first answer
                    continue
                result, ended, commit_error = step.result, step.ended, step.commit_error
            if await settle(c, result):
                stop = True
                break
        if earlier is not None:  # the calls after it were replayed: read its answers now
            stop = await settle(earlier.call, await self.settle_unanswered(conn, pipe, batch, earlier)) or stop
        if ended is None:
            commit_error = await end(conn, batch, stop)
        return stop, commit_error

    async def call(self, conn, pipe: Pipeline, batch: Batch, c: Call, *, commit: bool, fold: bool,
                   earlier: Unanswered | None = None) -> Step:
        """Run one call in a savepoint of its own, in the batch's pipeline.

        With ``fold`` the call's ledger row and RELEASE wait in the pipeline for the next call, and the call
        is returned :class:`Unanswered`; the next call, given it as ``earlier``, settles it. Without ``fold``
        the pipeline's Sync sends them (with ``commit``, the batch's COMMIT too). The pipeline is synced
        before anything is decided: ``earlier``'s RELEASE holds its answer exactly when ``earlier``'s
        statements all succeeded. When it holds none, ``earlier`` is undone and answered FAILED, and this
        call, whose statements all came after the failure and had no effect, is returned to run ``again``.

        Raises:
            Exception: an infrastructure error, a lost connection included, as psycopg raised it (the
                caller names a lost one, :func:`agentlab.core.batch.pipeline.lost`).
        """
        await run_hooks(batch.hooks.before_call, c, c.index)
        t0, started_ns = time.perf_counter(), time.time_ns()
        applied: tuple[dict, str] | None = None
        error: Exception | None = None
        release = None
        try:
            await pipe.enter()
            await conn.execute(SAVEPOINT)
            applied = await ledger.apply(conn, c, batch.context(c), ledger=batch.safeguards.ledger,
                                         attempt=batch.attempt, spend=batch.spend(c))
            release = await conn.execute(RELEASE_SAVEPOINT)
            if commit:
                await conn.execute(COMMIT)
        except Exception as exc:  # noqa: BLE001 (held until the Sync: psycopg would log it as a second error)
            error = exc
        # fold only when every earlier answer is in: a tool that read no result leaves them to this Sync
        folded = error is None and fold and (earlier is None or earlier.answered)
        if not folded:
            synced = await pipe.sync()  # the Sync's: a statement that failed there, or a lost connection
            error = error or synced
        raised = error  # as psycopg raised it: PipelineAborted is no server's answer (no SQLSTATE)
        if error is not None:
            if isinstance(error, psycopg.errors.PipelineAborted) and not conn.broken:
                error = aborted(error)
            if conn.broken or is_infrastructure(error):
                raise error
        latency_ms = (time.perf_counter() - t0) * 1000
        earlier_result = None
        if earlier is not None:
            if not earlier.answered:  # its ledger row or RELEASE failed; this call ran on an aborted transaction
                return Step(earlier=await self.earlier_failed(conn, batch, earlier, raised), again=True)
            earlier_result = earlier.result
        if error is not None:
            if commit and applied is not None and conn.info.transaction_status is TransactionStatus.IDLE:
                # every statement of the call succeeded and COMMIT ran: the commit itself failed (C12)
                result, content = applied
                return Step(CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result,
                                       latency_ms=latency_ms, started_ns=started_ns), ended=BatchEnd.COMMIT_FAILED,
                            commit_error=batch.translate(error), earlier=earlier_result)
            await undo_savepoint(conn)
            answer = failed(c.index, c.call_id, c.name, batch.translate(error, c))
            answer.latency_ms, answer.started_ns = latency_ms, started_ns
            return Step(answer, earlier=earlier_result)
        result, content = applied
        done = CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result, latency_ms=latency_ms,
                          started_ns=started_ns)
        if folded:
            return Step(earlier=earlier_result, unanswered=Unanswered(c, done, release))
        return Step(done, ended=BatchEnd.COMMITTED if commit else None, earlier=earlier_result)

    @staticmethod
    async def earlier_failed(conn, batch: Batch, earlier: Unanswered, error: Exception | None) -> CallResult:
        """``earlier``'s ledger row or RELEASE failed (the pipeline has been synced): undo its savepoint and
        answer it FAILED with ``error`` when that is the server's (it holds a SQLSTATE), else
        ``FAILED [internal]`` (the next call's tool caught the server's error; the events keep it)."""
        if getattr(error, "sqlstate", None) is None:
            unknown = psycopg.Error(UNKNOWN_EARLIER_ERROR)
            unknown.__cause__ = error
            error = unknown
        c = earlier.call
        await undo_savepoint(conn)
        answer = failed(c.index, c.call_id, c.name, batch.translate(error, c))
        answer.latency_ms, answer.started_ns = earlier.result.latency_ms, earlier.result.started_ns
        return answer

    async def settle_unanswered(self, conn, pipe: Pipeline, batch: Batch, earlier: Unanswered) -> CallResult:
        """End the pipeline and settle ``earlier`` (no call came after it to carry its answers)."""
        raised = await pipe.sync()
        error = aborted(raised) if isinstance(raised, psycopg.errors.PipelineAborted) and not conn.broken else raised
        if error is not None and (conn.broken or is_infrastructure(error)):
            raise error
        if earlier.answered:
            return earlier.result
        return await self.earlier_failed(conn, batch, earlier, raised)


async def end(conn, batch: Batch, stop: bool) -> Translation | None:
    """COMMIT (or ROLLBACK when ``stop``); the translated reason when COMMIT itself failed, e.g. a deferred
    constraint (case C12). The server turns COMMIT of an aborted transaction into ROLLBACK. Raises an
    infrastructure error as it came."""
    try:
        await conn.execute(ROLLBACK if stop else COMMIT)
    except psycopg.Error as exc:
        tr = batch.translate(exc)
        if tr.infrastructure:
            raise
        return tr
    return None
