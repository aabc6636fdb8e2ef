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

Only one runner works on a run at a time (a session advisory lock per run, :class:`SagaBusy`).

Sources: H. Garcia-Molina and K. Salem, "Sagas" (1987); PostgreSQL docs "Advisory Locks",
"Partial Indexes"; DBOS Transact (exactly-once steps, retries with capped backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentlab.core.errors import AgentlabError, is_infrastructure

log = logging.getLogger(__name__)


class RunStatus(str, Enum):
    """A saga run's state."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    PARKED = "parked"  # waiting for a person; ``parked_reason`` says why


class StepStatus(str, Enum):
    """A saga step's state."""

    PENDING = "pending"
    RUNNING = "running"  # a step outside a transaction has started; its result is not stored yet
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    SENT_BUT_UNWOUND = "sent_but_unwound"  # an external effect that a correction answered
    COMPENSATION_FAILED = "compensation_failed"


class SagaBusy(AgentlabError):
    """Raised when another runner holds the run (its advisory lock)."""


class SagaError(AgentlabError):
    """Raised when a run does not match the definition given (another saga, other steps)."""


@dataclass
class StepContext:
    """What a step's action or compensation gets.

    ``conn`` is the step's open transaction (None for a step with ``in_transaction=False``);
    ``results`` maps the names of completed steps to their stored results.
    """

    run_id: int
    run_key: str
    position: int
    step: str
    attempt: int
    input: dict
    results: dict[str, dict]
    conn: Any = None

    def key(self, suffix: str = "") -> str:
        """A dedupe key for an effect of this step: ``saga:<run_id>:<position>[:<suffix>]``."""
        return f"saga:{self.run_id}:{self.position}" + (f":{suffix}" if suffix else "")


Action = Callable[[StepContext], Awaitable[dict]]
Compensation = Callable[[StepContext, dict], Awaitable[dict | None]]


@dataclass(frozen=True)
class Step:
    """One step.

    Attributes:
        name: unique within the saga.
        action: ``await action(ctx) -> dict`` (JSON-ready): the step's effect and its result.
        compensate: ``await compensate(ctx, args)`` undoes (or, for an external step, corrects) the
            effect; ``args`` is what was recorded when the step completed. None: nothing to undo.
        in_transaction: False for work that must not hold a transaction open (a model call).
        external: the effect leaves the system (a message, a payment): it can only be corrected.
        compensation_args: what to record for the compensation, from the result (default: the result).
    """

    name: str
    action: Action
    compensate: Compensation | None = None
    in_transaction: bool = True
    external: bool = False
    compensation_args: Callable[[dict, StepContext], dict] | None = None

    def compensation_record(self, result: dict, ctx: StepContext) -> dict:
        """The compensating action stored with the completed step: ``{"undo": name | None, "args": {...}}``."""
        if self.compensate is None:
            return {"undo": None, "args": {}}
        args = self.compensation_args(result, ctx) if self.compensation_args else result
        return {"undo": getattr(self.compensate, "__name__", "compensate"), "args": args}


@dataclass(frozen=True)
class SagaDefinition:
    """A named list of steps (positions start at 1)."""

    name: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError("step names must be unique within a saga")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: attempt ``n`` waits ``min(cap_s, initial_s * factor**(n-1))`` seconds."""

    max_attempts: int = 4
    initial_s: float = 0.05
    factor: float = 2.0
    cap_s: float = 1.0

    def delay_s(self, attempt: int) -> float:
        return min(self.cap_s, self.initial_s * self.factor ** (attempt - 1))


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying unchanged (:func:`agentlab.core.errors.is_infrastructure`)."""
    return isinstance(exc, Exception) and is_infrastructure(exc)


Hook = Callable[..., Awaitable[None] | None]


@dataclass
class SagaHooks:
    """Fault-injection points. ``after_step(position, name)`` after a step committed;
    ``after_failure(position, attempt, exc)`` after a failed attempt was recorded;
    ``before_compensation(position, name)`` before each compensation attempt's transaction."""

    after_step: list[Hook] = field(default_factory=list)
    after_failure: list[Hook] = field(default_factory=list)
    before_compensation: list[Hook] = field(default_factory=list)


async def _run_hooks(hooks: list[Hook], *args: Any) -> None:
    for hook in list(hooks):
        result = hook(*args)
        if result is not None:
            await result


# --------------------------------------------------------------------------- SQL

INSERT_RUN = """
INSERT INTO saga_runs (saga, run_key, input) VALUES (%s, %s, %s)
ON CONFLICT (run_key) DO NOTHING RETURNING id
"""
FIND_RUN = "SELECT id FROM saga_runs WHERE run_key = %s"
INSERT_STEP = "INSERT INTO saga_steps (run_id, position, name, external) VALUES (%s, %s, %s, %s)"
LOAD_RUN = """
SELECT id, saga, run_key, status, direction, input, failed_step, parked_reason FROM saga_runs WHERE id = %s
"""
LOAD_STEPS = """
SELECT position, name, status, attempts, result, compensation FROM saga_steps WHERE run_id = %s ORDER BY position
"""
RUN_LOCK = "SELECT pg_try_advisory_lock(hashtextextended('saga:' || %s::text, 0))"
RUN_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended('saga:' || %s::text, 0))"
SET_LOCAL_TIMEOUTS = "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)"
LOCK_STEP = "SELECT status, attempts FROM saga_steps WHERE run_id = %s AND position = %s FOR UPDATE"
MARK_RUNNING = """
UPDATE saga_steps SET status = 'running', attempts = attempts + 1, last_error = NULL
WHERE run_id = %s AND position = %s RETURNING attempts
"""
COMPLETE_STEP = """
UPDATE saga_steps SET status = 'completed', attempts = %s, result = %s, compensation = %s, last_error = NULL,
                      completed_at = now()
WHERE run_id = %s AND position = %s AND status IN ('pending', 'failed', 'running')
"""
FAIL_STEP = """
UPDATE saga_steps SET status = 'failed', attempts = attempts + %s, last_error = %s
WHERE run_id = %s AND position = %s AND status IN ('pending', 'failed', 'running') RETURNING attempts
"""
MARK_COMPENSATED = """
UPDATE saga_steps SET status = %s, compensated_at = now(), last_error = NULL
WHERE run_id = %s AND position = %s AND status IN ('completed', 'compensation_failed')
"""
MARK_COMPENSATION_FAILED = """
UPDATE saga_steps SET status = 'compensation_failed', last_error = %s WHERE run_id = %s AND position = %s
"""
INSERT_COMPENSATION_NEEDED = """
INSERT INTO compensation_needed (run_id, position, step, action, reason) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (run_id) WHERE status = 'open' DO NOTHING
"""
RESOLVE_COMPENSATION_NEEDED = """
UPDATE compensation_needed SET status = 'resolved', resolved_at = now()
WHERE run_id = %s AND position = %s AND status = 'open'
"""
SET_RUN = """
UPDATE saga_runs SET status = %s, direction = %s, failed_step = coalesce(%s, failed_step), parked_reason = %s,
                     updated_at = now()
WHERE id = %s
"""
INSERT_LOG = """
INSERT INTO saga_log (run_id, position, step, action, attempt, error_class, detail) VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
COMPENSATION_ORDER = """
SELECT position FROM saga_log WHERE run_id = %s AND action IN ('compensated', 'sent_but_unwound') ORDER BY id
"""
OPEN_COMPENSATION_NEEDED = """
SELECT id, position, step, action, reason, created_at FROM compensation_needed
WHERE run_id = %s AND status = 'open' ORDER BY id
"""
@dataclass
class SagaReport:
    """A run as the database holds it after the runner returned."""

    run_id: int
    run_key: str
    saga: str
    status: str
    direction: str
    failed_step: int | None
    parked_reason: str | None
    steps: list[dict]
    compensations: list[int]  # positions, in the order their compensations committed
    compensation_needed: list[dict]

    def as_dict(self) -> dict:
        return {
            "run_id": self.run_id, "run_key": self.run_key, "saga": self.saga, "status": self.status,
            "direction": self.direction, "failed_step": self.failed_step, "parked_reason": self.parked_reason,
            "steps": self.steps, "compensations": self.compensations,
            "compensation_needed": [{k: v for k, v in row.items() if k != "created_at"}
                                    for row in self.compensation_needed],
        }


def _describe(exc: BaseException) -> tuple[str, str]:
    """(error class, redacted one-line text) of an exception, for people: never shown to a model."""
    from agentlab.core.redact import redact

    first = (str(exc).strip().splitlines() or [""])[0]  # the primary message; CONTEXT lines go to the log
    return f"{type(exc).__module__}.{type(exc).__qualname__}", redact(f"{type(exc).__name__}: {first}")[:500]


class SagaRunner:
    """Runs one saga definition's runs on the kit's database.

    Args:
        pool: ``AsyncConnectionPool`` with autocommit connections (at least 2: the run's lock and a step).
        saga: the definition.
        retry: the forward-recovery backoff for transient step failures.
        compensation_retry: the backoff for transient compensation failures before escalation.
        lock_timeout_ms / statement_timeout_ms: ``SET LOCAL`` in each step's transaction.
    """

    def __init__(self, pool, saga: SagaDefinition, *, retry: Backoff = Backoff(),
                 compensation_retry: Backoff = Backoff(max_attempts=3), lock_timeout_ms: int = 300,
                 statement_timeout_ms: int = 5000):
        self.pool = pool
        self.saga = saga
        self.retry = retry
        self.compensation_retry = compensation_retry
        self.lock_timeout_ms = lock_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self.hooks = SagaHooks()

    # ------------------------------------------------------------------ public API

    async def start(self, run_key: str, input: dict) -> SagaReport:
        """Create the run for ``run_key`` (once: a second start finds it) and run it as far as it goes."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(INSERT_RUN, (self.saga.name, run_key, Jsonb(input)))).fetchone()
            if row is not None:
                run_id = row[0]
                for pos, step in enumerate(self.saga.steps, 1):
                    await conn.execute(INSERT_STEP, (run_id, pos, step.name, step.external))
                await conn.execute(INSERT_LOG, (run_id, None, None, "started", None, None, None))
            else:
                run_id = (await (await conn.execute(FIND_RUN, (run_key,))).fetchone())[0]
        return await self.resume(run_id)

    async def resume(self, run_id: int) -> SagaReport:
        """Continue a run from what the database holds: forward, backward, or out of ``parked``.

        Raises:
            SagaBusy: another runner holds the run.
            SagaError: the run belongs to another saga.
        """
        async with self._run_lock(run_id):
            run = await self._load_run(run_id)
            if run["status"] == RunStatus.PARKED.value:
                status = RunStatus.RUNNING if run["direction"] == "forward" else RunStatus.COMPENSATING
                await self._set_run(run_id, status, run["direction"], None, None, "resumed",
                                    detail=run["parked_reason"])
                run = await self._load_run(run_id)
            if run["status"] == RunStatus.RUNNING.value:
                failed = await self._forward(run)
                if failed is not None:
                    await self._set_run(run_id, RunStatus.COMPENSATING, "backward", failed, None, "compensating")
                    run = await self._load_run(run_id)
            if run["status"] == RunStatus.COMPENSATING.value:
                await self._backward(run)
        return await self.report(run_id)

    async def abort(self, run_id: int, reason: str) -> SagaReport:
        """A person's choice for a run parked going forward: give up and compensate what completed."""
        async with self._run_lock(run_id):
            run = await self._load_run(run_id)
            if run["status"] in (RunStatus.RUNNING.value, RunStatus.PARKED.value) and run["direction"] == "forward":
                await self._set_run(run_id, RunStatus.COMPENSATING, "backward", None, None, "aborted", detail=reason)
                await self._backward(await self._load_run(run_id))
        return await self.report(run_id)

    async def report(self, run_id: int) -> SagaReport:
        """What the database holds for the run."""
        run = await self._load_run(run_id, check=False)
        async with self.pool.connection() as conn:
            steps = await (await conn.execute(LOAD_STEPS, (run_id,))).fetchall()
            order = await (await conn.execute(COMPENSATION_ORDER, (run_id,))).fetchall()
            needed = await (await conn.execute(OPEN_COMPENSATION_NEEDED, (run_id,))).fetchall()
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
                except Exception as exc:
                    transient = is_transient(exc)
                    retry = transient and tries < self.retry.max_attempts
                    delay = self.retry.delay_s(tries) if retry else 0.0
                    attempt = await self._record_failure(run["id"], pos, step, exc, counted=step.in_transaction,
                                                         detail=(f"transient; retry in {delay:.3f} s" if retry else
                                                                 "transient; attempts exhausted" if transient else
                                                                 "permanent"))
                    await _run_hooks(self.hooks.after_failure, pos, attempt, exc)
                    if retry:
                        await asyncio.sleep(delay)
                        continue
                    if transient:
                        cls, _ = _describe(exc)
                        reason = f"step {pos} ({step.name}) still failing after {tries} attempts: {cls}"
                        await self._set_run(run["id"], RunStatus.PARKED, "forward", None, reason, "parked",
                                            detail=reason)
                        return None
                    return pos
                results[step.name] = result
                await _run_hooks(self.hooks.after_step, pos, step.name)
                break
        await self._set_run(run["id"], RunStatus.COMPLETED, "forward", None, None, "finished")
        return None

    async def _run_local(self, run: dict, pos: int, step: Step, results: dict) -> dict:
        """The step's effect and its completion record in one transaction."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(SET_LOCAL_TIMEOUTS, (f"{self.lock_timeout_ms}ms", f"{self.statement_timeout_ms}ms"))
            status, attempts = await (await conn.execute(LOCK_STEP, (run["id"], pos))).fetchone()
            if status == StepStatus.COMPLETED.value:
                raise _AlreadyDone()
            ctx = self._ctx(run, pos, step, attempts + 1, results, conn)
            result = await step.action(ctx)
            await conn.execute(COMPLETE_STEP, (ctx.attempt, Jsonb(result), Jsonb(step.compensation_record(result, ctx)),
                                               run["id"], pos))
            await conn.execute(INSERT_LOG, (run["id"], pos, step.name, "completed", ctx.attempt, None, None))
        return result

    async def _run_outside(self, run: dict, pos: int, step: Step, results: dict) -> dict:
        """Mark the step running (commit), do the work outside any transaction, store its result."""
        async with self.pool.connection() as conn, conn.transaction():
            status, _ = await (await conn.execute(LOCK_STEP, (run["id"], pos))).fetchone()
            if status == StepStatus.COMPLETED.value:
                raise _AlreadyDone()
            attempt = (await (await conn.execute(MARK_RUNNING, (run["id"], pos))).fetchone())[0]
            await conn.execute(INSERT_LOG, (run["id"], pos, step.name, "started", attempt, None, None))
        ctx = self._ctx(run, pos, step, attempt, results, None)
        result = await step.action(ctx)
        async with self.pool.connection() as conn, conn.transaction():
            record = step.compensation_record(result, ctx)
            cur = await conn.execute(COMPLETE_STEP, (attempt, Jsonb(result), Jsonb(record), run["id"], pos))
            if cur.rowcount != 1:
                raise _AlreadyDone()
            await conn.execute(INSERT_LOG, (run["id"], pos, step.name, "completed", attempt, None, None))
        return result

    async def _record_failure(self, run_id: int, pos: int, step: Step, exc: BaseException, *, counted: bool,
                              detail: str) -> int:
        cls, text = _describe(exc)
        async with self.pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(FAIL_STEP, (1 if counted else 0, text, run_id, pos))).fetchone()
            attempt = row[0] if row else None
            await conn.execute(INSERT_LOG, (run_id, pos, step.name, "failed", attempt, cls, f"{detail}: {text}"))
        log.info("saga run %s step %s (%s) attempt %s failed: %s", run_id, pos, step.name, attempt, exc)
        return attempt

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
                await _run_hooks(self.hooks.before_compensation, pos, step.name)
                try:
                    await self._compensate(run, pos, step, row, results, tries)
                    break
                except Exception as exc:
                    transient = is_transient(exc)
                    cls, text = _describe(exc)
                    if transient and tries < self.compensation_retry.max_attempts:
                        delay = self.compensation_retry.delay_s(tries)
                        await self._log(run["id"], pos, step.name, "compensation_failed", tries, cls,
                                        f"transient; retry in {delay:.3f} s: {text}")
                        await asyncio.sleep(delay)
                        continue
                    await self._escalate(run, pos, step, row, exc, tries)
                    return
        await self._set_run(run["id"], RunStatus.COMPENSATED, "backward", None, None, "finished")

    async def _compensate(self, run: dict, pos: int, step: Step, row: dict, results: dict, attempt: int) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(SET_LOCAL_TIMEOUTS, (f"{self.lock_timeout_ms}ms", f"{self.statement_timeout_ms}ms"))
            status, _ = await (await conn.execute(LOCK_STEP, (run["id"], pos))).fetchone()
            if status not in (StepStatus.COMPLETED.value, StepStatus.COMPENSATION_FAILED.value):
                return
            record = row["compensation"] or {"undo": None, "args": {}}
            if step.compensate is not None and record.get("undo") is not None:
                await step.compensate(self._ctx(run, pos, step, attempt, results, conn), record.get("args") or {})
                detail = record["undo"]
            else:
                detail = "nothing to undo"
            new = StepStatus.SENT_BUT_UNWOUND if step.external else StepStatus.COMPENSATED
            await conn.execute(MARK_COMPENSATED, (new.value, run["id"], pos))
            await conn.execute(RESOLVE_COMPENSATION_NEEDED, (run["id"], pos))
            await conn.execute(INSERT_LOG, (run["id"], pos, step.name, new.value, attempt, None, detail))

    async def _escalate(self, run: dict, pos: int, step: Step, row: dict, exc: BaseException, tries: int) -> None:
        """Stop: mark the step, leave one open "compensation needed" row, park the run."""
        cls, text = _describe(exc)
        reason = f"compensation of step {pos} ({step.name}) failed after {tries} attempt(s): {text}"
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(MARK_COMPENSATION_FAILED, (text, run["id"], pos))
            await conn.execute(INSERT_COMPENSATION_NEEDED, (run["id"], pos, step.name,
                                                            Jsonb(row["compensation"] or {}), reason))
            await conn.execute(INSERT_LOG, (run["id"], pos, step.name, "compensation_failed", tries, cls, text))
            await conn.execute(SET_RUN, (RunStatus.PARKED.value, "backward", None, reason, run["id"]))
            await conn.execute(INSERT_LOG, (run["id"], None, None, "parked", None, None, reason))
        log.warning("saga run %s parked: %s", run["id"], reason)

    # ------------------------------------------------------------------ plumbing

    def _ctx(self, run: dict, pos: int, step: Step, attempt: int, results: dict, conn) -> StepContext:
        return StepContext(run["id"], run["run_key"], pos, step.name, attempt, run["input"], dict(results), conn)

    async def _load_run(self, run_id: int, *, check: bool = True) -> dict:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(LOAD_RUN, (run_id,))).fetchone()
        if row is None:
            raise SagaError(f"no saga run {run_id}")
        run = dict(zip(("id", "saga", "run_key", "status", "direction", "input", "failed_step", "parked_reason"), row))
        if check and run["saga"] != self.saga.name:
            raise SagaError(f"run {run_id} belongs to saga {run['saga']!r}, not {self.saga.name!r}")
        return run

    async def _load_steps(self, run_id: int) -> dict[int, dict]:
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(LOAD_STEPS, (run_id,))).fetchall()
        steps = {p: {"name": n, "status": s, "attempts": a, "result": r, "compensation": c}
                 for p, n, s, a, r, c in rows}
        if [steps[p]["name"] for p in sorted(steps)] != [s.name for s in self.saga.steps]:
            raise SagaError(f"run {run_id} has other steps than saga {self.saga.name!r}")
        return steps

    async def _set_run(self, run_id: int, status: RunStatus, direction: str, failed_step: int | None,
                       reason: str | None, action: str, *, detail: str | None = None) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(SET_RUN, (status.value, direction, failed_step, reason, run_id))
            await conn.execute(INSERT_LOG, (run_id, failed_step, None, action, None, None, detail))

    async def _log(self, run_id: int, pos: int | None, step: str | None, action: str, attempt: int | None,
                   error_class: str | None, detail: str | None) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(INSERT_LOG, (run_id, pos, step, action, attempt, error_class, detail))

    @contextlib.asynccontextmanager
    async def _run_lock(self, run_id: int):
        """Hold the run's session advisory lock on a connection of its own while the runner works."""
        async with self.pool.connection() as conn:
            if not (await (await conn.execute(RUN_LOCK, (run_id,))).fetchone())[0]:
                raise SagaBusy(f"saga run {run_id} is being run by another runner")
            try:
                yield
            finally:
                try:
                    await conn.execute(RUN_UNLOCK, (run_id,))
                except psycopg.Error:  # a broken connection is discarded by the pool, its lock with it
                    log.info("could not unlock saga run %s; its connection is gone", run_id)


class _AlreadyDone(Exception):
    """The step was completed by an earlier attempt (its stored result stands)."""
