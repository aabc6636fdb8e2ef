"""Job state: a persisted state machine per job, so "timed out" is never mistaken for "failed".

A client that gives up waiting does not know whether the work happened. Retrying blindly writes a
second record; giving up loses a finished result. The kit keeps one row per job in ``jobs``::

    pending ──claim──> running ──complete──> succeeded          (result stored, same transaction
       │                  │  └───fail────> failed                as the work's own writes)
       │                  └──lease expired──> unknown ──claim──> running (attempt + 1)
       └───────────────────────────────────────────────────┘

Rules the database enforces, not the code:

- at most one live job per key: a partial unique index on ``job_key WHERE status <> 'failed'``, so
  two "succeeded" jobs for one key cannot exist (a failed attempt stays as history);
- a result exactly when succeeded (``CHECK``), a lease while running, a finish time when final;
- every transition is a guarded ``UPDATE ... WHERE status = ... AND attempt = ...``: the attempt is a
  fencing token. The work's writes and the transition to ``succeeded`` commit in one transaction,
  so when a slow worker has lost its lease (another took the job over) its guarded ``UPDATE``
  matches no row, :class:`JobLost` is raised and its writes roll back: no half-written record.

:meth:`JobStore.run` is the client call. It returns the stored result when the job already
succeeded, waits for a running one, and otherwise claims the job and does the work. When the
client's ``timeout_s`` passes first it raises :class:`JobTimeout` and the work goes on (shielded, as
a server goes on after its client hung up); calling :meth:`JobStore.run` again with the same key
returns the finished result instead of writing again.

Sources: PostgreSQL docs "Partial Indexes", "UPDATE" (READ COMMITTED re-checks the WHERE clause on
the row version it waited for); M. Kleppmann, "How to do distributed locking" (fencing tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from agentlab.core.errors import AgentlabError
from agentlab.core.tasks import pause

log = logging.getLogger(__name__)


class JobStatus(str, Enum):
    """A job's state."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # its worker lost the lease without a verdict; the work did not commit


class JobTimeout(AgentlabError, TimeoutError):
    """Raised when a client's wait for a job ran out; the job may still finish. Retry with the same key."""

    def __init__(self, job_key: str, status: str):
        super().__init__(f"job {job_key!r} did not finish in time (last seen {status}); retry with the same key")
        self.job_key = job_key
        self.status = status


class JobLost(AgentlabError):
    """Raised when a worker's guarded completion matched no row: another worker took the job over.
    The worker's transaction rolls back, its writes with it."""


class JobKeyConflict(AgentlabError):
    """Raised when a job key is used again with another kind or other arguments: a key names one job
    (as the ledger's idempotency key names one tool call). Nothing is submitted or run."""

    def __init__(self, job_key: str):
        super().__init__(JOB_KEY_CONFLICT.format(key=job_key))
        self.job_key = job_key


class JobFailed(AgentlabError):
    """Raised by :meth:`JobStore.run` when the job's last attempt failed; ``error`` is its stored error."""

    def __init__(self, job_key: str, error: str | None):
        super().__init__(f"job {job_key!r} failed: {error}")
        self.job_key = job_key
        self.error = error


JOB_KEY_CONFLICT = ("job key {key!r} was submitted before with another kind or other arguments; a job key binds "
                    "to its kind and arguments: use a new key for a new job")
SAME_JOB = """
SELECT kind = %s AND args = %s::jsonb FROM jobs WHERE job_key = %s AND status <> 'failed'
"""
SUBMIT = """
INSERT INTO jobs (job_key, kind, args) VALUES (%s, %s, %s)
ON CONFLICT (job_key) WHERE status <> 'failed' DO NOTHING
"""
FIND_LIVE = """
SELECT id, job_key, kind, args, status, attempt, result, error, lease_until < now() AS lease_expired
FROM jobs WHERE job_key = %s AND status <> 'failed'
"""
FIND_LATEST = """
SELECT id, job_key, kind, args, status, attempt, result, error, lease_until < now() AS lease_expired
FROM jobs WHERE job_key = %s ORDER BY id DESC LIMIT 1
"""
EXPIRE_LEASE = """
UPDATE jobs SET status = 'unknown', lease_until = NULL
WHERE id = %s AND status = 'running' AND lease_until < now()
"""
EXPIRE_LEASES = """
UPDATE jobs SET status = 'unknown', lease_until = NULL WHERE status = 'running' AND lease_until < now()
"""
CLAIM = """
UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_until = now() + make_interval(secs => %s),
                started_at = now(), error = NULL
WHERE id = %s AND status IN ('pending', 'unknown')
RETURNING attempt
"""
COMPLETE = """
UPDATE jobs SET status = 'succeeded', result = %s, lease_until = NULL, finished_at = now()
WHERE id = %s AND status = 'running' AND attempt = %s
"""
FAIL = """
UPDATE jobs SET status = 'failed', error = %s, lease_until = NULL, finished_at = now()
WHERE id = %s AND status = 'running' AND attempt = %s
"""
LIST_JOBS = """
SELECT id, job_key, kind, status, attempt, result, error, created_at, started_at, finished_at
FROM jobs WHERE (%(key)s::text IS NULL OR job_key = %(key)s) ORDER BY id
"""


@dataclass(frozen=True)
class Job:
    """One row of ``jobs`` as read."""

    id: int
    job_key: str
    kind: str
    args: dict
    status: JobStatus
    attempt: int
    result: dict | None
    error: str | None
    lease_expired: bool | None

    @classmethod
    def from_row(cls, row) -> Job:
        return cls(row[0], row[1], row[2], row[3], JobStatus(row[4]), row[5], row[6], row[7], row[8])


@dataclass(frozen=True)
class JobResult:
    """What :meth:`JobStore.run` returns: the job's result and whether this call did the work."""

    job_key: str
    result: dict
    attempt: int
    replayed: bool  # True: the work had been done before; the stored result was returned


Work = Callable[[Any, dict], Awaitable[dict]]


class JobStore:
    """Jobs on the kit's database.

    Args:
        pool: ``AsyncConnectionPool`` with autocommit connections (the store opens its own transactions).
        lease_s: how long a claim is valid, in seconds; a running job past it becomes ``unknown``.
        poll_s: how often a waiting client re-reads a running job, in seconds.
    """

    def __init__(self, pool, *, lease_s: float = 30.0, poll_s: float = 0.02):
        self.pool = pool
        self.lease_s = lease_s
        self.poll_s = poll_s
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, job_key: str, kind: str, args: dict) -> Job:
        """The live job for ``job_key``, created ``pending`` if there is none (idempotent).

        Raises:
            JobKeyConflict: the key's live job has another kind or other arguments (the database
                compares them, ``jsonb`` equality, before and after the insert). A failed job is
                history: after it the key is free for a corrected job, as its partial unique index says.
        """
        encoded = json.dumps(args, default=str)
        async with self.pool.connection() as conn:
            same = await (await conn.execute(SAME_JOB, (kind, encoded, job_key))).fetchone()
            if same is not None and not same[0]:
                raise JobKeyConflict(job_key)
            await conn.execute(SUBMIT, (job_key, kind, encoded))
            row = await (await conn.execute(FIND_LIVE, (job_key,))).fetchone()
            same = await (await conn.execute(SAME_JOB, (kind, encoded, job_key))).fetchone()
        if row is None:  # pragma: no cover - a concurrent failure between the two statements; retry
            return await self.submit(job_key, kind, args)
        if not same[0]:  # a concurrent first submission with other arguments won the insert
            raise JobKeyConflict(job_key)
        return Job.from_row(row)

    async def get(self, job_key: str) -> Job | None:
        """The job's latest row (the live one, else the last failed one), or None."""
        async with self.pool.connection() as conn:
            row = await (await conn.execute(FIND_LATEST, (job_key,))).fetchone()
        return Job.from_row(row) if row else None

    async def expire_leases(self) -> int:
        """Mark every running job whose lease has expired ``unknown``; return how many."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(EXPIRE_LEASES)
            return cur.rowcount

    async def claim(self, job: Job) -> int | None:
        """Take ``job`` (pending, unknown, or running past its lease); return the attempt, or None if taken."""
        async with self.pool.connection() as conn:
            if job.status is JobStatus.RUNNING:
                await conn.execute(EXPIRE_LEASE, (job.id,))
            row = await (await conn.execute(CLAIM, (self.lease_s, job.id))).fetchone()
        return row[0] if row else None

    async def execute(self, job: Job, attempt: int, work: Work) -> dict:
        """Run ``work(conn, args)`` and the transition to ``succeeded`` in one transaction.

        Raises:
            JobLost: the job was taken over meanwhile; nothing of this attempt is kept.
            Exception: whatever ``work`` raised; the job is then ``failed`` with the error's class and text.
        """
        try:
            async with self.pool.connection() as conn, conn.transaction():
                result = await work(conn, job.args)
                cur = await conn.execute(COMPLETE, (json.dumps(result, default=str), job.id, attempt))
                if cur.rowcount != 1:
                    raise JobLost(f"job {job.job_key!r} attempt {attempt} lost its claim; its writes are rolled back")
        except JobLost:
            raise
        except Exception as exc:
            async with self.pool.connection() as conn:
                await conn.execute(FAIL, (f"{type(exc).__name__}: {exc}"[:500], job.id, attempt))
            raise
        return json.loads(json.dumps(result, default=str))

    async def run(self, job_key: str, kind: str, args: dict, work: Work, *,
                  timeout_s: float | None = None) -> JobResult:
        """Do the job for ``job_key`` once, however often it is called; see the module docstring.

        Raises:
            JobKeyConflict: ``job_key`` was used with another ``kind`` or other ``args``; nothing runs.
            JobTimeout: ``timeout_s`` passed before the job finished (it may finish later: call again).
            JobFailed: the job's attempt failed.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        job = await self.submit(job_key, kind, args)
        while True:
            if job.status is JobStatus.SUCCEEDED:
                return JobResult(job_key, job.result, job.attempt, replayed=True)
            if job.status is JobStatus.FAILED:  # another client's attempt failed meanwhile
                raise JobFailed(job_key, job.error)
            if job.status is JobStatus.RUNNING and not job.lease_expired:
                if deadline is not None and loop.time() >= deadline:
                    raise JobTimeout(job_key, job.status.value)
                await pause(self.poll_s)  # a caller's cancellation the pool lost ends the wait here
                job = await self.get(job_key)
                continue
            attempt = await self.claim(job)
            if attempt is None:  # another client claimed it first: wait for that one
                job = await self.get(job_key)
                continue
            task = asyncio.ensure_future(self.execute(job, attempt, work))
            self._tasks.add(task)
            task.add_done_callback(self._finished)
            remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                result = await asyncio.wait_for(asyncio.shield(task), remaining)
            except TimeoutError:
                raise JobTimeout(job_key, JobStatus.RUNNING.value) from None
            except JobLost:
                job = await self.get(job_key)
                continue
            except Exception:
                # the outcome is read back, never assumed: a connection lost during COMMIT may have committed
                current = await self.get(job_key)
                if current is not None and current.status is JobStatus.SUCCEEDED and current.attempt == attempt:
                    return JobResult(job_key, current.result, attempt, replayed=False)
                raise JobFailed(job_key, current.error if current else None) from None
            return JobResult(job_key, result, attempt, replayed=False)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("job attempt ended with %s", type(task.exception()).__name__)

    async def wait_idle(self) -> None:
        """Wait for work that clients stopped waiting for (their timeout passed) to end."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def frame(self, job_key: str | None = None):
        """Jobs (all, or one key's attempts) as a pandas DataFrame, oldest first."""
        import pandas as pd

        async with self.pool.connection() as conn:
            rows = await (await conn.execute(LIST_JOBS, {"key": job_key})).fetchall()
        return pd.DataFrame(rows, columns=["id", "job_key", "kind", "status", "attempt", "result", "error",
                                           "created_at", "started_at", "finished_at"])


# --------------------------------------------------------------------------- the story, for a notebook

SLOW_INVOICE_TRIGGER = """
CREATE OR REPLACE FUNCTION agentlab_slow_invoice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(coalesce(nullif(current_setting('agentlab.invoice_sleep_s', true), ''), '0')::float8);
RETURN NEW; END $$;
DROP TRIGGER IF EXISTS agentlab_slow_invoice ON invoices;
CREATE TRIGGER agentlab_slow_invoice BEFORE INSERT ON invoices FOR EACH ROW EXECUTE FUNCTION agentlab_slow_invoice();
"""
DROP_SLOW_INVOICE_TRIGGER = "DROP TRIGGER IF EXISTS agentlab_slow_invoice ON invoices"
SET_SLOW_SECONDS = "SELECT set_config('agentlab.invoice_sleep_s', %s, true)"  # this transaction only
CREATE_INVOICE_FOR_JOB = """
INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents)
SELECT tenant_id, id, %s, %s FROM customers WHERE id = %s RETURNING id
"""
COUNT_INVOICES = "SELECT count(*) FROM invoices WHERE customer_id = %s AND billing_period = %s"


async def create_invoice_job(conn, args: dict) -> dict:
    """A job's work: create one invoice (``customer_id``, ``billing_period``, ``amount_cents``)."""
    await conn.execute(SET_SLOW_SECONDS, (str(args.get("sleep_s", 0)),))
    cur = await conn.execute(CREATE_INVOICE_FOR_JOB, (args["billing_period"], args["amount_cents"],
                                                      args["customer_id"]))
    return {"invoice_id": (await cur.fetchone())[0]}


async def timeout_then_retry(pool, customer_id: int, billing_period: str = "2026-05-01", *, amount_cents: int = 4200,
                             client_timeout_s: float = 0.1, work_s: float = 0.8) -> dict:
    """The resume-pipeline story, measured: the client gives up after ``client_timeout_s`` while the
    write takes ``work_s`` (a trigger that sleeps: a real slow INSERT); the client retries with the
    same job key. Returns what happened and the counts read back from the database."""
    async with pool.connection() as conn:
        await conn.execute(SLOW_INVOICE_TRIGGER)
    store = JobStore(pool)
    key = f"invoice:{customer_id}:{billing_period}"
    args = {"customer_id": customer_id, "billing_period": billing_period, "amount_cents": amount_cents,
            "sleep_s": work_s}
    first = "finished"
    try:
        await store.run(key, "invoice", args, create_invoice_job, timeout_s=client_timeout_s)
    except JobTimeout as exc:
        first = f"JobTimeout (last seen {exc.status})"
    retry = await store.run(key, "invoice", args, create_invoice_job, timeout_s=work_s * 10)
    await store.wait_idle()
    async with pool.connection() as conn:
        await conn.execute(DROP_SLOW_INVOICE_TRIGGER)
        invoices = (await (await conn.execute(COUNT_INVOICES, (customer_id, billing_period))).fetchone())[0]
    jobs = await store.frame(key)
    return {"first_call": first, "retry_replayed": retry.replayed, "retry_result": retry.result,
            "invoices": invoices, "job_rows": len(jobs), "job_status": list(jobs["status"]),
            "attempts": list(jobs["attempt"])}
