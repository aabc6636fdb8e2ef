"""Sagas: a workflow one transaction cannot hold, persisted step by step, with the three recoveries.

A :class:`SagaDefinition` is a list of :class:`Step`. A run of it (``saga_runs``, one row per business
key, ``saga_steps``, one row per step, and the journal ``saga_log``) survives the process:
:meth:`SagaRunner.resume` continues any run where the database says it stopped.

- **Each step commits once.** A local step runs in its own short transaction together with the
  row that marks it ``completed`` and records its result and its *compensating action*; so the
  effect exists exactly when the record does (as DBOS records a step's output with its effect).
  A step that cannot sit in a transaction (``in_transaction=False``: a model call) is marked
  ``running`` first, runs outside any transaction, and its result is stored after; a completed
  step is never run again, on retry or on recovery, so an expensive call is paid for once.
- **Forward recovery.** A transient failure (:func:`is_transient`: lost connection, busy lock,
  serialization failure, timeouts) retries *only the failed step*, with capped exponential backoff
  (:class:`Backoff`); completed steps stay. When the attempts run out the run is parked.
- **Backward recovery.** A permanent failure runs the recorded compensations of the completed
  steps in reverse order, each in its own transaction. An external step (``external=True``, e.g. a
  notification sent through the outbox) cannot be undone: its compensation sends a correction and
  the step is marked ``sent_but_unwound``, never ``compensated``.
- **Escalation.** When a compensation fails (permanently, or transiently past its attempts) the
  saga stops at once: later compensations do not run, the step is ``compensation_failed``, the run
  is ``parked`` with its reason, and exactly one open ``compensation_needed`` row tells a person
  what is left (a partial unique index holds it to one per run). :meth:`SagaRunner.resume` after the
  fix retries that compensation, resolves the row and goes on.

- **Point of no return.** A ``pivot`` step (a refund paid out, a contract signed) cannot be undone:
  once it committed the run can only go forward. :meth:`SagaRunner.abort` is refused
  (:class:`AbortRefused`), and a permanent failure after it parks the run instead of compensating.

Only one runner works on a run at a time. A session advisory lock per run refuses a second runner
early (:class:`SagaBusy`), but no correctness rests on it: a session can be terminated, and behind a
transaction-mode pooler it is shared. Each runner *claims* the run with a fresh owner token (a
fencing token), and every transaction that commits a step, a compensation or a change of state
first locks the run row and checks the token, the status and the direction; a runner that lost the
run gets :class:`SagaFenced` and its transaction rolls back (both guards: :mod:`agentlab.durable.saga_fencing`).

Behind a transaction-mode pooler (PgBouncer ``pool_mode = transaction``) pass ``behind_pooler=True``:
the runner then takes no session advisory lock at all. There a session lock lands on whichever server
session the pooler lent for that one statement: every client lent the same session re-enters it (no
refusal), and its unlock may be lent another session, so the lock stays held on a session nobody
watches and refuses later runners of a run nobody runs. Without it a second runner is not refused
early; it claims the run, and the first is fenced at its next transaction. ``fencing=False`` is the
weaker setting of the failure lab (case C32): the session lock is all that keeps a second runner out.

Sources: H. Garcia-Molina and K. Salem, "Sagas" (1987); PostgreSQL docs "Advisory Locks",
"Partial Indexes", "Row-Level Locks"; DBOS Transact (exactly-once steps, retries with capped backoff);
Azure Architecture Center, "Saga distributed transactions pattern" (compensable, pivot and retryable
steps); M. Kleppmann, "How to do distributed locking" (fencing tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from psycopg.types.json import Jsonb

from agentlab.core.hooks import run_hooks
from agentlab.durable import saga_sql as q  # the runner's statements and error texts
from agentlab.durable.saga_fencing import fenced_transaction, session_lock
from agentlab.durable.saga_model import (  # noqa: F401 (importable from here as before)
    AbortRefused,
    Action,
    Backoff,
    Compensation,
    RunStatus,
    SagaBusy,
    SagaDefinition,
    SagaError,
    SagaFenced,
    SagaHooks,
    SagaReport,
    Step,
    StepContext,
    StepStatus,
    describe_step,
    is_transient,
)

log = logging.getLogger(__name__)


class SagaRunner:
    """Runs one saga definition's runs on the kit's database.

    Args:
        pool: ``AsyncConnectionPool`` with autocommit connections (at least 2: the run's lock and a step).
        saga: the definition.
        retry: the forward-recovery backoff for transient step failures.
        compensation_retry: the backoff for transient compensation failures before escalation.
        lock_timeout_ms / statement_timeout_ms: ``SET LOCAL`` in each step's transaction.
        behind_pooler: the pool reaches the server through a transaction-mode pooler: take no session
            advisory lock (it would land on a shared server session); the fencing alone keeps runners apart.
        fencing: lock the run row and check the owner token, status and direction in every transaction
            that commits (default). False is the failure lab's weaker setting (case C32): the session
            advisory lock is then the only guard, and a runner that lost it still commits.
    """

    def __init__(self, pool, saga: SagaDefinition, *, retry: Backoff = Backoff(),
                 compensation_retry: Backoff = Backoff(max_attempts=3), lock_timeout_ms: int = 300,
                 statement_timeout_ms: int = 5000, behind_pooler: bool = False, fencing: bool = True):
        self.pool = pool
        self.saga = saga
        self.retry = retry
        self.compensation_retry = compensation_retry
        self.lock_timeout_ms = lock_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self.behind_pooler = behind_pooler
        self.fencing = fencing
        self.hooks = SagaHooks()

    # ------------------------------------------------------------------ public API

    async def start(self, run_key: str, input: dict) -> SagaReport:
        """Create the run for ``run_key`` (once: a second start with the same input finds it) and run
        it as far as it goes.

        Raises:
            SagaError: ``run_key`` names a run of another saga or with another input (a run key binds
                to its input; nothing is changed).
            SagaBusy: another runner holds the run.
        """
        async with self.pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(q.INSERT_RUN, (self.saga.name, run_key, Jsonb(input)))).fetchone()
            if row is not None:
                run_id = row[0]
                for pos, step in enumerate(self.saga.steps, 1):
                    await conn.execute(q.INSERT_STEP, (run_id, pos, step.name, step.external))
                await conn.execute(q.INSERT_LOG, (run_id, None, None, "started", None, None, None))
            else:
                run_id, saga, same_input = await (await conn.execute(q.FIND_RUN, (Jsonb(input), run_key))).fetchone()
                if saga != self.saga.name or not same_input:
                    raise SagaError(q.RUN_KEY_REUSED.format(key=run_key, run_id=run_id,
                                                          what="belongs to another saga" if saga != self.saga.name
                                                          else "was started with another input"))
        return await self.resume(run_id)

    async def resume(self, run_id: int) -> SagaReport:
        """Continue a run from what the database holds: forward, backward, or out of ``parked``.

        Raises:
            SagaBusy: another runner holds the run.
            SagaFenced: another runner claimed the run while this one worked (this one's last
                transaction rolled back).
            SagaError: the run belongs to another saga.
        """
        async with self._claim(run_id) as run:
            if run["status"] == RunStatus.PARKED.value:
                status = RunStatus.RUNNING if run["direction"] == "forward" else RunStatus.COMPENSATING
                await self._set_run(run, status, run["direction"], None, None, "resumed",
                                    detail=run["parked_reason"], expect=RunStatus.PARKED)
                run = await self._reload(run)
            if run["status"] == RunStatus.RUNNING.value:
                failed = await self._forward(run)
                if failed is not None:
                    pivot = await self._turn_back(run, failed, "compensating", None)
                    if pivot is not None:
                        reason = q.PAST_PIVOT_FAILURE.format(pos=failed, step=self.saga.steps[failed - 1].name,
                                                           pivot=pivot[0], pivot_step=pivot[1])
                        await self._set_run(run, RunStatus.PARKED, "forward", failed, reason, "parked",
                                            detail=reason, expect=RunStatus.RUNNING)
                    run = await self._reload(run)
            if run["status"] == RunStatus.COMPENSATING.value:
                await self._backward(run)
        return await self.report(run_id)

    async def abort(self, run_id: int, reason: str) -> SagaReport:
        """A person's choice for a run going forward (parked, or left ``running`` by a dead process):
        give up and compensate what completed, in reverse order.

        Raises:
            AbortRefused: a pivot step (the point of no return) has committed; nothing is changed and
                the refusal is journaled (``abort_refused``): :meth:`resume` finishes the run.
            SagaBusy / SagaFenced / SagaError: as :meth:`resume`.
        """
        async with self._claim(run_id) as run:
            if run["status"] in (RunStatus.RUNNING.value, RunStatus.PARKED.value) and run["direction"] == "forward":
                pivot = await self._turn_back(run, None, "aborted", reason)
                if pivot is not None:
                    raise AbortRefused(q.ABORT_REFUSED.format(run_id=run_id, pos=pivot[0], step=pivot[1]))
                await self._backward(await self._reload(run))
        return await self.report(run_id)

    async def report(self, run_id: int) -> SagaReport:
        """What the database holds for the run."""
        run = await self._load_run(run_id, check=False)
        async with self.pool.connection() as conn:
            steps = await (await conn.execute(q.LOAD_STEPS, (run_id,))).fetchall()
            order = await (await conn.execute(q.COMPENSATION_ORDER, (run_id,))).fetchall()
            needed = await (await conn.execute(q.OPEN_COMPENSATION_NEEDED, (run_id,))).fetchall()
        return SagaReport(
            run_id, run["run_key"], run["saga"], run["status"], run["direction"], run["failed_step"],
            run["parked_reason"],
            [{"position": p, "name": n, "status": s, "attempts": a} for p, n, s, a, _, _ in steps],
            [r[0] for r in order],
            [{"id": i, "position": p, "step": s, "action": a, "reason": r, "created_at": t}
             for i, p, s, a, r, t in needed],
        )

    # ------------------------------------------------------------------ forward

    async def _forward(self, run: dict) -> int | None:
        """Run the steps not yet completed. Returns the position of a permanent failure, else None
        (completed, or parked after a transient failure outlived its attempts)."""
        rows = await self._load_steps(run["id"])
        results = {r["name"]: r["result"] for r in rows.values() if r["status"] == StepStatus.COMPLETED.value}
        for pos, step in enumerate(self.saga.steps, 1):
            if rows[pos]["status"] == StepStatus.COMPLETED.value:
                continue
            tries = 0
            while True:
                tries += 1
                try:
                    result = await (self._run_local(run, pos, step, results) if step.in_transaction
                                    else self._run_outside(run, pos, step, results))
                except _AlreadyDone:
                    result = (await self._load_steps(run["id"]))[pos]["result"]
                except SagaFenced:
                    raise
                except Exception as exc:
                    transient = is_transient(exc)
                    retry = transient and tries < self.retry.max_attempts
                    delay = self.retry.delay_s(tries) if retry else 0.0
                    attempt = await self._record_failure(run, pos, step, exc, counted=step.in_transaction,
                                                         detail=(f"transient; retry in {delay:.3f} s" if retry else
                                                                 "transient; attempts exhausted" if transient else
                                                                 "permanent"))
                    await run_hooks(self.hooks.after_failure, pos, attempt, exc)
                    if retry:
                        await asyncio.sleep(delay)
                        continue
                    if transient:
                        cls, _ = describe_step(exc)
                        reason = f"step {pos} ({step.name}) still failing after {tries} attempts: {cls}"
                        await self._set_run(run, RunStatus.PARKED, "forward", None, reason, "parked",
                                            detail=reason, expect=RunStatus.RUNNING)
                        return None
                    return pos
                results[step.name] = result
                await run_hooks(self.hooks.after_step, pos, step.name)
                break
        await self._set_run(run, RunStatus.COMPLETED, "forward", None, None, "finished", expect=RunStatus.RUNNING)
        return None

    async def _run_local(self, run: dict, pos: int, step: Step, results: dict) -> dict:
        """The step's effect and its completion record in one transaction (fenced: see :meth:`_txn`)."""
        async with self._txn(run, RunStatus.RUNNING, "forward") as conn:
            status, attempts = await (await conn.execute(q.LOCK_STEP, (run["id"], pos))).fetchone()
            if status == StepStatus.COMPLETED.value:
                raise _AlreadyDone()
            ctx = self._ctx(run, pos, step, attempts + 1, results, conn)
            result = await step.action(ctx)
            await conn.execute(q.COMPLETE_STEP, (ctx.attempt, Jsonb(result), Jsonb(step.compensation_record(result, ctx)),
                                               run["id"], pos))
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, "completed", ctx.attempt, None, None))
        return result

    async def _run_outside(self, run: dict, pos: int, step: Step, results: dict) -> dict:
        """Mark the step running (commit), do the work outside any transaction, store its result."""
        async with self._txn(run, RunStatus.RUNNING, "forward") as conn:
            status, _ = await (await conn.execute(q.LOCK_STEP, (run["id"], pos))).fetchone()
            if status == StepStatus.COMPLETED.value:
                raise _AlreadyDone()
            attempt = (await (await conn.execute(q.MARK_RUNNING, (run["id"], pos))).fetchone())[0]
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, "started", attempt, None, None))
        ctx = self._ctx(run, pos, step, attempt, results, None)
        result = await step.action(ctx)
        async with self._txn(run, RunStatus.RUNNING, "forward") as conn:
            record = step.compensation_record(result, ctx)
            cur = await conn.execute(q.COMPLETE_STEP, (attempt, Jsonb(result), Jsonb(record), run["id"], pos))
            if cur.rowcount != 1:
                raise _AlreadyDone()
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, "completed", attempt, None, None))
        return result

    async def _record_failure(self, run: dict, pos: int, step: Step, exc: BaseException, *, counted: bool,
                              detail: str) -> int:
        cls, text = describe_step(exc)
        async with self._txn(run, RunStatus.RUNNING, "forward") as conn:
            row = await (await conn.execute(q.FAIL_STEP, (1 if counted else 0, text, run["id"], pos))).fetchone()
            attempt = row[0] if row else None
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, "failed", attempt, cls, f"{detail}: {text}"))
        log.info("saga run %s step %s (%s) attempt %s failed: %s", run["id"], pos, step.name, attempt, exc)
        return attempt

    async def _turn_back(self, run: dict, failed_step: int | None, action: str,
                         detail: str | None) -> tuple[int, str] | None:
        """Set the run compensating, in one transaction with the check that no pivot step has committed
        (or, outside a transaction, started). Returns None, or ``(position, name)`` of that pivot step:
        then the run is unchanged and the journal says why (``abort_refused`` / ``past_pivot``)."""
        async with self._txn(run, None, "forward") as conn:
            rows = await (await conn.execute(q.LOAD_STEPS, (run["id"],))).fetchall()
            for pos, name, status, *_ in rows:
                if self.saga.steps[pos - 1].pivot and status in (StepStatus.COMPLETED.value,
                                                                 StepStatus.RUNNING.value):
                    refused = "abort_refused" if action == "aborted" else "past_pivot"
                    await conn.execute(q.INSERT_LOG, (run["id"], pos, name, refused, None, None, detail))
                    return pos, name
            await conn.execute(q.SET_RUN, (RunStatus.COMPENSATING.value, "backward", failed_step, None, run["id"]))
            await conn.execute(q.INSERT_LOG, (run["id"], failed_step, None, action, None, None, detail))
        return None

    # ------------------------------------------------------------------ backward

    async def _backward(self, run: dict) -> None:
        """Compensate completed steps in reverse order; stop and escalate at the first that fails."""
        rows = await self._load_steps(run["id"])
        results = {r["name"]: r["result"] for r in rows.values() if r["result"] is not None}
        for pos in range(len(self.saga.steps), 0, -1):
            row, step = rows[pos], self.saga.steps[pos - 1]
            if row["status"] not in (StepStatus.COMPLETED.value, StepStatus.COMPENSATION_FAILED.value):
                continue
            tries = 0
            while True:
                tries += 1
                await run_hooks(self.hooks.before_compensation, pos, step.name)
                try:
                    await self._compensate(run, pos, step, row, results, tries)
                    break
                except SagaFenced:
                    raise
                except Exception as exc:
                    transient = is_transient(exc)
                    cls, text = describe_step(exc)
                    if transient and tries < self.compensation_retry.max_attempts:
                        delay = self.compensation_retry.delay_s(tries)
                        await self._log(run, pos, step.name, "compensation_failed", tries, cls,
                                        f"transient; retry in {delay:.3f} s: {text}")
                        await asyncio.sleep(delay)
                        continue
                    await self._escalate(run, pos, step, row, exc, tries)
                    return
        await self._set_run(run, RunStatus.COMPENSATED, "backward", None, None, "finished",
                            expect=RunStatus.COMPENSATING)

    async def _compensate(self, run: dict, pos: int, step: Step, row: dict, results: dict, attempt: int) -> None:
        async with self._txn(run, RunStatus.COMPENSATING, "backward") as conn:
            status, _ = await (await conn.execute(q.LOCK_STEP, (run["id"], pos))).fetchone()
            if status not in (StepStatus.COMPLETED.value, StepStatus.COMPENSATION_FAILED.value):
                return
            record = row["compensation"] or {"undo": None, "args": {}}
            if step.compensate is not None and record.get("undo") is not None:
                await step.compensate(self._ctx(run, pos, step, attempt, results, conn), record.get("args") or {})
                detail = record["undo"]
            else:
                detail = "nothing to undo"
            new = StepStatus.SENT_BUT_UNWOUND if step.external else StepStatus.COMPENSATED
            await conn.execute(q.MARK_COMPENSATED, (new.value, run["id"], pos))
            await conn.execute(q.RESOLVE_COMPENSATION_NEEDED, (run["id"], pos))
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, new.value, attempt, None, detail))

    async def _escalate(self, run: dict, pos: int, step: Step, row: dict, exc: BaseException, tries: int) -> None:
        """Stop: mark the step, leave one open "compensation needed" row, park the run."""
        cls, text = describe_step(exc)
        reason = f"compensation of step {pos} ({step.name}) failed after {tries} attempt(s): {text}"
        async with self._txn(run, RunStatus.COMPENSATING, "backward") as conn:
            await conn.execute(q.MARK_COMPENSATION_FAILED, (text, run["id"], pos))
            await conn.execute(q.INSERT_COMPENSATION_NEEDED, (run["id"], pos, step.name,
                                                            Jsonb(row["compensation"] or {}), reason))
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step.name, "compensation_failed", tries, cls, text))
            await conn.execute(q.SET_RUN, (RunStatus.PARKED.value, "backward", None, reason, run["id"]))
            await conn.execute(q.INSERT_LOG, (run["id"], None, None, "parked", None, None, reason))
        log.warning("saga run %s parked: %s", run["id"], reason)

    # ------------------------------------------------------------------ plumbing

    def _ctx(self, run: dict, pos: int, step: Step, attempt: int, results: dict, conn) -> StepContext:
        return StepContext(run["id"], run["run_key"], pos, step.name, attempt, run["input"], dict(results), conn)

    async def _load_run(self, run_id: int, *, check: bool = True) -> dict:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(q.LOAD_RUN, (run_id,))).fetchone()
        if row is None:
            raise SagaError(f"no saga run {run_id}")
        run = dict(zip(("id", "saga", "run_key", "status", "direction", "input", "failed_step", "parked_reason"), row))
        if check and run["saga"] != self.saga.name:
            raise SagaError(f"run {run_id} belongs to saga {run['saga']!r}, not {self.saga.name!r}")
        return run

    async def _reload(self, run: dict) -> dict:
        """The run as the database holds it now, with this runner's owner token."""
        return {**await self._load_run(run["id"]), "token": run["token"]}

    async def _load_steps(self, run_id: int) -> dict[int, dict]:
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(q.LOAD_STEPS, (run_id,))).fetchall()
        steps = {p: {"name": n, "status": s, "attempts": a, "result": r, "compensation": c}
                 for p, n, s, a, r, c in rows}
        if [steps[p]["name"] for p in sorted(steps)] != [s.name for s in self.saga.steps]:
            raise SagaError(f"run {run_id} has other steps than saga {self.saga.name!r}")
        return steps

    async def _set_run(self, run: dict, status: RunStatus, direction: str, failed_step: int | None,
                       reason: str | None, action: str, *, detail: str | None = None,
                       expect: RunStatus | None = None) -> None:
        async with self._txn(run, expect, None) as conn:
            await conn.execute(q.SET_RUN, (status.value, direction, failed_step, reason, run["id"]))
            await conn.execute(q.INSERT_LOG, (run["id"], failed_step, None, action, None, None, detail))

    async def _log(self, run: dict, pos: int | None, step: str | None, action: str, attempt: int | None,
                   error_class: str | None, detail: str | None) -> None:
        async with self._txn(run, None, None) as conn:
            await conn.execute(q.INSERT_LOG, (run["id"], pos, step, action, attempt, error_class, detail))

    def _txn(self, run: dict, status: RunStatus | None, direction: str | None):
        """A transaction that may commit for this run, fenced by its owner token (and, when given, this
        status and direction): :func:`agentlab.durable.saga_fencing.fenced_transaction`."""
        return fenced_transaction(self.pool, run, status, direction, lock_timeout_ms=self.lock_timeout_ms,
                                  statement_timeout_ms=self.statement_timeout_ms, fencing=self.fencing)

    @contextlib.asynccontextmanager
    async def _claim(self, run_id: int):
        """Take the run: its session advisory lock (a second runner is refused early), then a fresh
        owner token in the run row, which every later transaction of this runner checks. Yields the run."""
        async with self._run_lock(run_id):
            run = await self._load_run(run_id)
            run["token"] = uuid.uuid4()
            async with self.pool.connection() as conn:
                await conn.execute(q.CLAIM_RUN, (run["token"], run_id))
            yield run

    def _run_lock(self, run_id: int):
        """The run's session advisory lock, held while the runner works (none behind a transaction-mode
        pooler): :func:`agentlab.durable.saga_fencing.session_lock`."""
        return session_lock(self.pool, run_id, behind_pooler=self.behind_pooler)


class _AlreadyDone(Exception):
    """The step was completed by an earlier attempt (its stored result stands)."""
