"""The transactional tools node: one transaction per batch of tool calls, a savepoint per call.

Under the ``full`` preset a batch (the tool calls of one ``AIMessage``) runs like this:

1. every call is validated first (unknown tool, duplicate id, argument model); under the atomic
   policy one invalid call means no SQL is sent at all;
2. one short transaction, opened now and committed before control returns to the model:
   ``pg_advisory_xact_lock`` on the thread, ``statement_timeout`` / ``lock_timeout`` set locally, and
   the least-privilege agent role and the thread's tenant (from the graph config) set locally, so
   row-level security shows the tools only that tenant's rows (:mod:`agentlab.lab.tenancy`);
3. one ledger look-up for the whole batch: a call whose idempotency key (tenant, thread, tool call id,
   occurrence: :func:`idempotency_key`) is stored returns the stored result instead of running again
   (node retry, resume after a crash).
   BEGIN, the prelude's ``SELECT`` and the look-up are pipelined: three statements, one round trip;
4. per call a SAVEPOINT holding the call's SQL and its ledger row, so a failure is attributed to its
   call and leaves the transaction usable. The calls share one pipeline (psycopg's pipeline mode): the
   SAVEPOINT goes out with the tool's first statement, and the ledger row with the RELEASE goes out with
   the next call's SAVEPOINT and first statement (the last call's, with COMMIT, in the batch's Sync), so a
   one-statement tool costs one round trip and the batch two more, to open and to commit (the refund
   story's three calls: 6, against 18 for psycopg's nested ``conn.transaction()`` blocks). When a ledger
   row or RELEASE fails, the next call's statements were skipped by the server: that call is run again
   from the start after the failed one is undone. The ledger
   row is inserted inside the call's savepoint, not with the batch's rows at the end: a row that
   cannot be stored (a duplicate key, a value JSONB refuses) must fail its own call only, and under
   the partial policy a call's row must commit with exactly that call's effects;
5. atomic policy: the first failure rolls the batch back; partial policy: keep the calls that
   succeeded. Nothing is reported applied before COMMIT has returned;
6. exactly one ToolMessage per tool call id, in call order: the result, ``FAILED [...]`` with a
   sanitized reason, or ``NOT APPLIED: ...``.

Infrastructure errors (lost connection, killed backend, busy lock: see
:func:`agentlab.core.errors.is_infrastructure`) are raised so that the graph's RetryPolicy re-runs the
node; on the last attempt the node answers instead, and a connection lost during COMMIT is resolved
by reading the ledger on a fresh connection, never by a blind retry.

Weaker presets switch layers off (:mod:`agentlab.core.safeguards`). Without a transaction each
statement autocommits. Without savepoints the node behaves as a first transactional draft does: it
reports each call as it returns and commits at the end; after a failure PostgreSQL turns that
COMMIT into a ROLLBACK (the "aborted transaction" trap, case C09), so calls reported as applied are
lost. The events table records that as ``commit_rolled_back``.

Sources: PostgreSQL docs "SAVEPOINT", "Advisory Locks", "statement_timeout", "Frontend/Backend Protocol:
Pipelining" (after an error the server skips every message up to the next Sync); libpq "Pipeline Mode";
psycopg docs "Transactions management" (nested transaction blocks), "Pipeline mode support"; LangGraph
"RetryPolicy".
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from agentlab.core.errors import Category, ErrorHints, ToolError, Translation, is_infrastructure, translate
from agentlab.core.storable import storable
from agentlab.core.messages import (
    BATCH_ROLLED_BACK, CALL_ID_TOO_LONG, COMMIT_FAILED, DUPLICATE_CALL_ID, FAILED_PREFIX, FAILED_TEMPLATE,
    INVALID_CALL_ID, INVALID_JSON_ARGUMENTS, LEDGER_ARGS_MISMATCH, MISSING_CALL_ID, NOT_APPLIED_TEMPLATE, batches,
    occurrences, with_call_ids,
)
from agentlab.core.events import EventLog
from agentlab.core.hooks import Hook, run_hooks
from agentlab.core.prepared import forget_prepared
from agentlab.core.safeguards import READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE, Policy, Safeguards
from agentlab.core.run_lock import DEFAULT_TTL_MS, RENEW_LEASE, RUN_TOKEN_KEY, LeaseLost
from agentlab.core.schema import STRICT_SCHEMA
from agentlab.core.isolation import TenantMismatch, isolation_prelude, require_tenant
from agentlab.core.toolspec import ToolContext, ToolSpec, Toolset, result_content

log = logging.getLogger(__name__)

LEDGER_LOOKUP = "SELECT idempotency_key, result FROM tool_executions WHERE idempotency_key = ANY(%s)"
LEDGER_LOOKUP_WITH_ARGS = (
    "SELECT idempotency_key, args, result FROM tool_executions WHERE idempotency_key = ANY(%s)"
)
LEDGER_INSERT = """
INSERT INTO tool_executions (idempotency_key, tenant_id, thread_id, tool_call_id, occurrence, tool_name, args, result,
                             attempt)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
MAX_CALL_ID_CHARS = 256  # provider ids are 20-40 characters; a longer one cannot be a real id (case C19)
# The thread's tenant: bound by the thread's first batch, read back by every later one. Under isolation it
# runs as the agent role after the prelude, so another tenant's binding is invisible: no row = not yours.
BIND_THREAD_TENANT = """
WITH bound AS (INSERT INTO thread_tenants (thread_id, tenant_id) VALUES (%(thread)s, %(tenant)s)
               ON CONFLICT (thread_id) DO NOTHING RETURNING tenant_id)
SELECT tenant_id FROM bound UNION ALL SELECT tenant_id FROM thread_tenants WHERE thread_id = %(thread)s
"""
THREAD_TENANT = "SELECT tenant_id FROM thread_tenants WHERE thread_id = %s"
BEGIN, COMMIT, ROLLBACK = "BEGIN", "COMMIT", "ROLLBACK"
# the batch's BEGIN per isolation level (Safeguards.isolation_level); read committed is the server's default
BEGIN_AT = {READ_COMMITTED: BEGIN, REPEATABLE_READ: "BEGIN ISOLATION LEVEL REPEATABLE READ",
            SERIALIZABLE: "BEGIN ISOLATION LEVEL SERIALIZABLE"}
# the savepoint each call runs in (the node's own, named here: one call's block is open at a time)
SAVEPOINT_NAME = "tool_call"
SAVEPOINT = sql.SQL("SAVEPOINT {}").format(sql.Identifier(SAVEPOINT_NAME))
RELEASE_SAVEPOINT = sql.SQL("RELEASE {}").format(sql.Identifier(SAVEPOINT_NAME))
ROLLBACK_TO_SAVEPOINT = sql.SQL("ROLLBACK TO {}").format(sql.Identifier(SAVEPOINT_NAME))
SET_SEARCH_PATH = "SELECT set_config('search_path', %s, false)"
RESET_SEARCH_PATH = "RESET search_path"


class Outcome(str, Enum):
    """What happened to one tool call."""

    APPLIED = "applied"  # ran and is committed
    REPLAYED = "replayed"  # was applied earlier; the stored result was returned
    FAILED = "failed"  # refused or failed; the model is told why
    NOT_APPLIED = "not_applied"  # rolled back or never ran because of another call or the infrastructure


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


@dataclass
class CallResult:
    """The outcome of one tool call and the ToolMessage content it produces."""

    index: int
    call_id: str
    tool: str
    outcome: Outcome
    content: str
    category: str | None = None
    result: dict | None = None
    translation: Translation | None = None
    latency_ms: float = 0.0

    def message(self) -> ToolMessage:
        ok = self.outcome in (Outcome.APPLIED, Outcome.REPLAYED)
        return ToolMessage(
            content=self.content, tool_call_id=self.call_id, name=self.tool, status="success" if ok else "error",
            artifact={"outcome": self.outcome.value, "category": self.category},
        )


@dataclass
class BatchResult:
    """The outcome of one batch: one :class:`CallResult` per distinct tool call id, in call order."""

    results: list[CallResult]
    rolled_back: bool
    attempt: int = 1

    @property
    def messages(self) -> list[ToolMessage]:
        return [r.message() for r in self.results]

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome is outcome for r in self.results)


@dataclass
class NodeHooks:
    """Fault-injection points (used by :mod:`agentlab.lab.faults` and the tests).

    ``before_call(call, index)`` and ``after_call(call, index)`` run around each tool call inside the
    transaction; ``after_commit(calls)`` runs after COMMIT returned and before the node returns. With a
    ``before_call`` or ``after_call`` hook a call's ledger row and RELEASE are not folded into the next
    call's round trip: each call ends with its own Sync, so a hook sees every statement sent so far answered.
    """

    before_call: list[Hook] = field(default_factory=list)
    after_call: list[Hook] = field(default_factory=list)
    after_commit: list[Hook] = field(default_factory=list)


def _not_applied(index: int, call_id: str, tool: str, reason: str) -> CallResult:
    return CallResult(index, call_id, tool, Outcome.NOT_APPLIED, NOT_APPLIED_TEMPLATE.format(reason=reason),
                      Category.NOT_APPLIED.value)


def _commit_failed(c: "_Call", tr: Translation) -> CallResult:
    """A call of a batch whose COMMIT failed: nothing of it is applied, whatever it returned before."""
    reason = COMMIT_FAILED.format(reason=tr.reason.rstrip("."))
    content = FAILED_TEMPLATE.format(category=tr.category.value, reason=reason) if tr.message.startswith(
        FAILED_PREFIX) else tr.message
    return CallResult(c.index, c.call_id, c.name, Outcome.FAILED, content, tr.category.value, translation=tr)


def _failed(index: int, call_id: str, tool: str, tr: Translation) -> CallResult:
    outcome = Outcome.NOT_APPLIED if tr.category is Category.NOT_APPLIED else Outcome.FAILED
    return CallResult(index, call_id, tool, outcome, tr.message, tr.category.value, translation=tr)


@dataclass
class _Call:
    index: int
    call_id: str
    name: str
    raw_args: Any
    occurrence: int = 0
    spec: ToolSpec | None = None
    args: Mapping[str, Any] | None = None


class TransactionalToolsNode:
    """Runs batches of tool calls against PostgreSQL under a :class:`Safeguards` value.

    Args:
        pool: ``psycopg_pool.AsyncConnectionPool`` on the kit's database, autocommit connections.
        safeguards: which layers are on.
        toolset: the domain's tools (:class:`agentlab.core.toolspec.Toolset`, e.g. ``domain.toolset``).
        provider: the payment provider, called inline only when ``safeguards.outbox`` is off.
        events: where events go (a log-only :class:`EventLog` when None).
        max_attempts: the graph's RetryPolicy attempts; on the last one the node answers instead of raising.
        error_hints: what the translator tells the model for the domain's own constraints
            (``domain.error_hints``); None: the core's generic texts only.
    """

    def __init__(self, pool, safeguards: Safeguards, *, toolset: Toolset, provider=None,
                 events: EventLog | None = None, max_attempts: int = 3, error_hints: ErrorHints | None = None):
        self.pool = pool
        self.safeguards = safeguards
        self.toolset = toolset
        self.provider = provider
        self.events = events or EventLog(None)
        self.max_attempts = max_attempts
        self.error_hints = error_hints
        self.lease_ttl_ms = DEFAULT_TTL_MS  # how long each batch renews its run's thread lease for
        self.hooks = NodeHooks()

    # ------------------------------------------------------------------ preparation

    def _prepare(self, tool_calls: Sequence[Mapping[str, Any]], invalid_tool_calls: Sequence[Mapping[str, Any]] = (),
                 occurrence: Mapping[str, int] | None = None) -> tuple[list[_Call], dict[int, CallResult]]:
        """Resolve tools, reject missing, duplicate or unstorable ids, calls whose arguments were not
        valid JSON and (with validation on) invalid arguments; no SQL."""
        sg = self.safeguards
        calls: list[_Call] = []
        failed: dict[int, CallResult] = {}
        every = [*tool_calls, *invalid_tool_calls]
        ids = [str(c.get("id") or "") for c in every]
        seen: set[str] = set()
        for i, c in enumerate(every):
            call_id = ids[i]
            if call_id in seen:
                continue  # one ToolMessage per id: the first occurrence answers for all (missing ids too)
            seen.add(call_id)
            call = _Call(len(calls), call_id, str(c.get("name")), c.get("args"), (occurrence or {}).get(call_id, 0))
            calls.append(call)
            try:
                if not call_id:  # None or "": refused by name (the graph gives such calls a stable id first)
                    raise _Duplicate(MISSING_CALL_ID)
                if ids.count(call_id) > 1:
                    raise _Duplicate()
                if not storable(call_id):  # the ledger key holds the id: a NUL or lone surrogate cannot be stored
                    raise _Duplicate(INVALID_CALL_ID)
                if len(call_id) > MAX_CALL_ID_CHARS:  # the ledger's key index cannot hold it (SQLSTATE 54000)
                    raise _Duplicate(CALL_ID_TOO_LONG)
                if i >= len(tool_calls):  # AIMessage.invalid_tool_calls: the arguments were not valid JSON
                    raise _Duplicate(INVALID_JSON_ARGUMENTS)
                call.spec = self.toolset.get_tool(c.get("name"))
                if sg.validation:
                    call.args = call.spec.validate(call.raw_args)
                else:
                    call.args = call.raw_args if isinstance(call.raw_args, Mapping) else {}
            except _Duplicate as exc:
                failed[call.index] = CallResult(
                    call.index, call_id, call.name, Outcome.FAILED,
                    FAILED_TEMPLATE.format(category=Category.INVALID_ARGUMENTS.value,
                                           reason=exc.args[0] if exc.args else DUPLICATE_CALL_ID),
                    Category.INVALID_ARGUMENTS.value,
                )
            except Exception as exc:
                allowed = call.spec.arg_names if call.spec else ()
                failed[call.index] = _failed(call.index, call_id, call.name,
                                             translate(exc, allowed_args=allowed, sanitize=sg.sanitize, hints=self.error_hints))
        return calls, failed

    def _prelude(self, thread_id: str, tenant_id: str | None) -> tuple[str, list[Any]] | None:
        """One SELECT that sets the batch's local settings and takes the thread's advisory lock; under
        isolation it first switches to the agent role and the thread's tenant (:mod:`agentlab.lab.tenancy`)."""
        sg, parts, params = self.safeguards, [], []
        if sg.isolation:
            parts, params = isolation_prelude(tenant_id)
        if sg.schema != STRICT_SCHEMA:
            parts.append("set_config('search_path', %s, true)")
            params.append(f"{sg.schema}, public")
        if sg.timeouts:
            parts += ["set_config('statement_timeout', %s, true)", "set_config('lock_timeout', %s, true)"]
            params += [f"{sg.statement_timeout_ms}ms", f"{sg.lock_timeout_ms}ms"]
        if sg.lock:
            parts.append("pg_advisory_xact_lock(hashtextextended(%s, 0))")
            params.append(thread_id)
        if not parts:
            return None
        return "SELECT " + ", ".join(parts), params

    # ------------------------------------------------------------------ execution

    async def run_batch(self, tool_calls: Sequence[Mapping[str, Any]], *, thread_id: str,
                        tenant_id: str | None = None, attempt: int = 1, final_attempt: bool = False,
                        invalid_tool_calls: Sequence[Mapping[str, Any]] = (),
                        occurrence: Mapping[str, int] | None = None, run_token: str | None = None) -> BatchResult:
        """Run one batch and return one result per distinct tool call id, in call order.

        Args:
            tool_calls: ``AIMessage.tool_calls`` (dicts with ``name``, ``args``, ``id``).
            thread_id, tenant_id: the thread and its tenant (from the graph config, never from the model).
            attempt, final_attempt: the node's attempt under the RetryPolicy.
            invalid_tool_calls: ``AIMessage.invalid_tool_calls`` (arguments that were not valid JSON): each
                is answered ``FAILED [invalid_arguments]`` and counts as a failed call of the batch.
            occurrence: per call id, how many earlier AIMessages of the thread hold it (see
                :func:`idempotency_key`); 0 when missing.
            run_token: the owner token of the run's thread lease (:mod:`agentlab.core.run_lock`); the
                batch renews the lease as its first statement and is refused when the run lost it.

        A call without an id (None or ``""``) is refused with ``FAILED [invalid_arguments]`` naming the
        missing id; :meth:`as_node` never sends one, it gives such calls a stable synthetic id first.

        Raises:
            Exception: an infrastructure error (see :func:`agentlab.core.errors.is_infrastructure`) unless
                ``final_attempt``; the batch is then rolled back and the graph retries the node.
            agentlab.lab.tenancy.TenantRequired: isolation is on and ``tenant_id`` is missing (before any SQL).
            agentlab.core.run_lock.LeaseLost: ``run_token`` no longer holds the thread (rolled back, no tool SQL).
        """
        sg = self.safeguards
        if sg.isolation:
            require_tenant(tenant_id)
        calls, results = self._prepare(tool_calls, invalid_tool_calls, occurrence)
        runnable = [c for c in calls if c.index not in results]
        rolled_back = False
        if results and sg.policy is Policy.ATOMIC:
            runnable, rolled_back = [], True  # one bad call: no SQL at all
        ran_ok: set[int] = set()
        if runnable:
            try:
                if sg.transaction:
                    rolled_back = await self._run_transaction(runnable, results, ran_ok, thread_id, tenant_id, attempt,
                                                              run_token)
                else:
                    await self._run_autocommit(runnable, results, ran_ok, thread_id, tenant_id, attempt)
                if ran_ok and not rolled_back:
                    await run_hooks(self.hooks.after_commit, list(tool_calls))
            except Exception as exc:
                tr = translate(exc, sanitize=sg.sanitize, hints=self.error_hints)
                if not tr.infrastructure:
                    raise
                self.events.record("tools", "infrastructure_error", thread_id=thread_id, sqlstate=tr.sqlstate,
                                   error_class=tr.error_class, detail=tr.detail, attempt=attempt)
                if not final_attempt:
                    raise
                await self._resolve_after_loss(runnable, results, thread_id, tenant_id, tr, exc)
                rolled_back = not any(r.outcome is Outcome.REPLAYED for r in results.values())
        for c in calls:  # calls that never ran (batch rejected before SQL or stopped early)
            if c.index not in results:
                results[c.index] = _not_applied(c.index, c.call_id, c.name, BATCH_ROLLED_BACK)
        if not rolled_back and sg.policy is Policy.PARTIAL:
            rolled_back = bool(results) and not any(
                r.outcome in (Outcome.APPLIED, Outcome.REPLAYED) for r in results.values()
            ) and any(r.outcome is Outcome.FAILED for r in results.values())
        ordered = [results[c.index] for c in calls]
        for r in ordered:
            tr = r.translation
            self.events.record(
                "tools", r.outcome.value, kind="call", thread_id=thread_id, tool_name=r.tool, tool_call_id=r.call_id,
                category=r.category, sqlstate=tr.sqlstate if tr else None, error_class=tr.error_class if tr else None,
                detail=tr.detail if tr else None, attempt=attempt, latency_ms=round(r.latency_ms, 3),
            )
        await self.events.maybe_flush()
        return BatchResult(ordered, rolled_back, attempt)

    async def _open(self, conn, runnable: list[_Call], thread_id: str, tenant_id: str | None,
                    run_token: str | None = None) -> dict[str, tuple]:
        """BEGIN, the prelude (settings, role, tenant, advisory lock) and the ledger look-up for the whole
        batch, pipelined: three statements, one round trip (four with a tenant: the thread's binding to
        its tenant, :data:`BIND_THREAD_TENANT`). Returns ``{key: (args, result)}`` of stored calls.

        With a ``run_token`` the thread's lease is renewed right after BEGIN, in the same round trip
        (:data:`agentlab.core.run_lock.RENEW_LEASE`): the lease row stays locked until COMMIT. BEGIN carries
        the isolation level of the safeguards (:data:`BEGIN_AT`).

        Raises:
            TenantMismatch: the thread belongs to another tenant (the caller rolls back).
            LeaseLost: the run no longer holds the thread's lease (the caller rolls back).

        They stay three statements: in READ COMMITTED each takes its own snapshot when it starts, so the
        look-up sees every batch that committed while this one waited for the thread's lock (in the same
        statement as the lock it would not)."""
        sg = self.safeguards
        prelude = self._prelude(thread_id, tenant_id)
        cur = bind = lease = None
        async with conn.pipeline():
            await conn.execute(BEGIN_AT[sg.isolation_level])
            if run_token is not None:
                lease = await conn.execute(RENEW_LEASE, (self.lease_ttl_ms, thread_id, run_token))
            if prelude is not None:
                await conn.execute(*prelude)
            if tenant_id is not None:
                bind = await conn.execute(BIND_THREAD_TENANT, {"thread": thread_id, "tenant": tenant_id})
            if sg.ledger:
                cur = await conn.execute(LEDGER_LOOKUP_WITH_ARGS,
                                         ([self._key(thread_id, tenant_id, c) for c in runnable],))
        if lease is not None and await lease.fetchone() is None:
            raise LeaseLost("this run no longer holds its thread (another run took it over after this run's lease "
                            "expired); nothing of this batch was applied")
        bound = await bind.fetchall() if bind is not None else None
        if bound == []:  # a twin batch bound the thread and committed after this statement's snapshot was taken
            bound = await (await conn.execute(THREAD_TENANT, (thread_id,))).fetchall()
        if bound is not None and tenant_id not in {t for t, in bound}:
            raise TenantMismatch("this thread belongs to another tenant; use the thread's own tenant or a new thread")
        return {k: (a, r) for k, a, r in await cur.fetchall()} if cur is not None else {}

    async def _run_transaction(self, runnable: list[_Call], results: dict[int, CallResult], ran_ok: set[int],
                               thread_id: str, tenant_id: str | None, attempt: int, run_token: str | None = None) -> bool:
        """Run ``runnable`` in one transaction; True when the batch was rolled back. The safe path is
        :meth:`_run_with_savepoints`; without savepoints, the first draft :meth:`_run_without_savepoints`."""
        run = self._run_with_savepoints if self.safeguards.savepoints else self._run_without_savepoints
        return await run(runnable, results, ran_ok, thread_id, tenant_id, attempt, run_token)

    # ------------------------------------------------------------------ the safe path

    async def _run_with_savepoints(self, runnable: list[_Call], results: dict[int, CallResult], ran_ok: set[int],
                                   thread_id: str, tenant_id: str | None, attempt: int,
                                   run_token: str | None = None) -> bool:
        """One transaction (opened by :meth:`_open`), a savepoint per call (:meth:`_call_in_savepoint`), the calls
        sharing one pipeline, every applied call reported only after COMMIT returned (case C12).

        A call's ledger row and RELEASE are sent without a Sync of their own: they go out with the next
        call's SAVEPOINT and first statement, and the call's outcome is settled when their answers come
        back with that statement's (the fold). No fold around a hook (``before_call``, ``after_call``):
        a hook sees the batch between calls, every statement sent so far answered. COMMIT goes out with
        the last call's Sync when nothing runs after it (no ``after_call`` hook); when that call fails the
        server skips the COMMIT, the call's savepoint is undone, and the batch ends as any other (COMMIT
        under the partial policy, ROLLBACK under the atomic one).

        A call the ledger holds is replayed; a failed call rolls back its savepoint only; under the atomic
        policy it also ends the batch with ROLLBACK and its siblings are answered NOT APPLIED."""
        sg = self.safeguards
        stop = False
        pending: dict[int, CallResult] = {}
        fold = not self.hooks.before_call and not self.hooks.after_call

        async def settle(c: _Call, result: CallResult) -> bool:
            """Record ``c``'s outcome; True when it ends the batch (a failure under the atomic policy)."""
            if result.outcome is Outcome.APPLIED:
                pending[c.index] = result  # reported only after COMMIT returns
                ran_ok.add(c.index)
                if self.hooks.after_call:
                    await run_hooks(self.hooks.after_call, c, c.index)
                return False
            results[c.index] = result
            return result.outcome is Outcome.FAILED and sg.policy is Policy.ATOMIC

        async with self.pool.connection() as conn:
            fatal = _FatalNotice()  # in a pipeline, a terminated backend's last words arrive as a notice
            conn.add_notice_handler(fatal)
            pipe = _Pipeline(conn)
            try:
                stored = await self._open(conn, runnable, thread_id, tenant_id, run_token)
                ended: Translation | bool | None = None  # COMMIT sent with the last call: True, or why it failed
                earlier: _Unanswered | None = None  # a call whose ledger row and RELEASE await their answers
                for pos, c in enumerate(runnable):
                    result = self._from_ledger(c, stored.get(self._key(thread_id, tenant_id, c)))
                    if result is None:
                        last = pos == len(runnable) - 1
                        # nothing runs after the last call (no after_call hook): its round trip carries COMMIT
                        commit = last and not self.hooks.after_call
                        while True:
                            step = await self._call_in_savepoint(conn, pipe, c, thread_id, tenant_id, attempt,
                                                                 commit=commit, fold=fold and not last,
                                                                 earlier=earlier)
                            if earlier is not None:
                                stop, earlier = await settle(earlier.call, step.earlier), None
                            if stop or not step.again:
                                break
                        if stop:
                            break
                        if step.unanswered is not None:
                            earlier = step.unanswered  # settled with the next call's first answer
                            continue
                        result, ended = step.result, step.ended
                    if await settle(c, result):
                        stop = True
                        break
                if earlier is not None:  # the calls after it were replayed: read its answers now
                    stop = await settle(earlier.call, await self._settle_unanswered(conn, pipe, earlier)) or stop
                if ended is None:
                    commit_failed = await self._end(conn, stop)
                else:
                    commit_failed = None if ended is True else ended
            except BaseException as exc:
                await pipe.sync()  # a lost connection's error is the one raised below
                await _rollback_quietly(conn)
                if isinstance(exc, Exception) and (lost := _lost(conn, exc, fatal)) is not None:
                    raise lost from exc
                raise
            finally:
                conn.remove_notice_handler(fatal)
        if commit_failed is not None:
            self._commit_failed(runnable, results, pending, ran_ok, commit_failed, thread_id, attempt)
            return True
        if stop:
            ran_ok.clear()
            for i, r in pending.items():
                results[i] = _not_applied(i, r.call_id, r.tool, BATCH_ROLLED_BACK)
            return True
        results.update(pending)
        return False

    # ------------------------------------------------------------------ the first draft: no savepoints

    async def _run_without_savepoints(self, runnable: list[_Call], results: dict[int, CallResult],
                                      ran_ok: set[int], thread_id: str, tenant_id: str | None, attempt: int,
                                      run_token: str | None = None) -> bool:
        """One transaction and no savepoints, as a first draft writes it: each call is reported as it
        goes, a failure the database saw aborts the transaction, the later calls meet SQLSTATE 25P02 and
        COMMIT is turned into ROLLBACK by the server, so calls reported applied are not stored (case C09)."""
        sg = self.safeguards
        stop = aborted = False
        async with self.pool.connection() as conn:
            try:
                stored = await self._open(conn, runnable, thread_id, tenant_id, run_token)
                for c in runnable:
                    replayed = self._from_ledger(c, stored.get(self._key(thread_id, tenant_id, c)))
                    if replayed is not None:
                        results[c.index] = replayed
                        if replayed.outcome is Outcome.FAILED and sg.policy is Policy.ATOMIC:
                            stop = True
                            break
                        continue
                    result = await self._call(conn, c, thread_id, tenant_id, attempt)
                    results[c.index] = result  # a first draft reports as it goes: the C09 trap
                    if result.outcome is Outcome.APPLIED:
                        ran_ok.add(c.index)
                        if self.hooks.after_call:
                            await run_hooks(self.hooks.after_call, c, c.index)
                    else:
                        aborted = True  # the transaction may be aborted; later calls then meet 25P02
                in_error = conn.info.transaction_status is TransactionStatus.INERROR
                commit_failed = await self._end(conn, stop)
            except BaseException:
                await _rollback_quietly(conn)
                raise
        if commit_failed is not None:
            self._commit_failed(runnable, results, {}, ran_ok, commit_failed, thread_id, attempt)
            return True
        if aborted and in_error:
            self.events.record("tools", "commit_rolled_back", thread_id=thread_id, attempt=attempt,
                               detail="COMMIT of an aborted transaction was turned into ROLLBACK")
        if stop:
            ran_ok.clear()
            return True
        # a failure the database never saw (a refused call, a tool's own error) leaves the transaction
        # usable and COMMIT keeps the other calls: the batch was not rolled back
        return aborted and in_error

    # ------------------------------------------------------------------ shared by both

    def _from_ledger(self, c: _Call, stored: tuple | None) -> CallResult | None:
        """The answer the ledger gives for ``c``: its stored result (REPLAYED), FAILED [conflict] when the
        stored arguments differ (an edited fork: the earlier call stands), or None when it has no row."""
        if stored is None:
            return None
        stored_args, stored_result = stored
        if stored_args != _as_json(c.args):
            return _failed(c.index, c.call_id, c.name, translate(ToolError(LEDGER_ARGS_MISMATCH, Category.CONFLICT)))
        return CallResult(c.index, c.call_id, c.name, Outcome.REPLAYED, result_content(stored_result),
                          result=stored_result)

    async def _call_in_savepoint(self, conn, pipe: "_Pipeline", c: _Call, thread_id: str, tenant_id: str | None,
                                 attempt: int, *, commit: bool, fold: bool, earlier: "_Unanswered | None" = None,
                                 ) -> "_Step":
        """Run one call in a savepoint of its own, in the batch's pipeline: its statements are the ones psycopg's
        nested ``conn.transaction()`` sends, in the same order.

        The SAVEPOINT is queued and goes out with the tool's first statement (when the handler reads its
        result, psycopg sends a flush request: one round trip); each further statement whose result the
        handler reads costs one more. The ledger INSERT and the RELEASE are queued last. With ``fold`` they
        wait in the pipeline for the next call, whose SAVEPOINT and first statement carry them: the call is
        returned unanswered (:class:`_Unanswered`), and the next call, given it as ``earlier``, settles it.
        Without ``fold`` the pipeline's Sync sends them (one round trip), with ``commit`` the batch's COMMIT
        too. A one-statement tool costs two round trips alone, one when it folds into the next call.

        Every error is attributed to its call. In a pipeline the server skips every statement after an
        error up to the next Sync, and psycopg raises an error to whichever statement's result is read
        first after it came, so the pipeline is ended by a Sync (every answer read) before anything is
        decided. ``earlier``'s RELEASE then holds its answer exactly when ``earlier``'s statements all
        succeeded. When it holds none, the error is ``earlier``'s: its savepoint is rolled back,
        ``earlier`` answered FAILED, and this call, whose statements all came after the failure and had no
        effect, is returned to be run again from the start (``again``): the tool runs twice, its statements
        count once, as on a node retry. The first error with a SQLSTATE raised after ``earlier``'s
        statements is ``earlier``'s own (every later statement was skipped); when this call's tool caught it,
        ``earlier`` is answered ``FAILED [internal]`` (:meth:`_earlier_failed`). Otherwise the error is this
        call's, and ROLLBACK TO and RELEASE undo this call alone, in one more round trip.

        Returns the :class:`_Step`: ``earlier``'s outcome when given, and this call's result (APPLIED or
        FAILED), or the call unanswered, or ``again``; and what happened to a ``commit``: None when none
        was sent (or the call failed before it ran), True when it returned, the translated reason when
        COMMIT itself failed (the call's statements had all succeeded: case C12; the batch is rolled back).

        Raises:
            Exception: an infrastructure error, a lost connection included, as psycopg raised it (the caller
                names a lost one, :func:`_lost`; the graph's retry policy decides).
        """
        if self.hooks.before_call:
            await run_hooks(self.hooks.before_call, c, c.index)
        t0 = time.perf_counter()
        ctx = ToolContext(thread_id, c.call_id, self.safeguards, self.provider, tenant_id)
        applied: tuple[dict, str] | None = None
        error: Exception | None = None
        release = None
        try:
            await pipe.enter()
            await conn.execute(SAVEPOINT)
            applied = await self._apply(conn, c, ctx, thread_id, attempt)
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
                error = _aborted(error)
            if conn.broken or is_infrastructure(error):  # a lost connection is named by the caller (:func:`_lost`)
                raise error
        latency_ms = (time.perf_counter() - t0) * 1000
        earlier_result = None
        if earlier is not None:
            if not earlier.answered:  # its ledger row or RELEASE failed; this call ran on an aborted transaction
                return _Step(earlier=await self._earlier_failed(conn, earlier, raised), again=True)
            earlier_result = earlier.result
        if error is not None:
            if commit and applied is not None and conn.info.transaction_status is TransactionStatus.IDLE:
                # every statement of the call succeeded and COMMIT ran: the commit itself failed (C12)
                commit_failed = translate(error, sanitize=self.safeguards.sanitize, hints=self.error_hints)
                result, content = applied
                return _Step(CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result,
                                        latency_ms=latency_ms), ended=commit_failed, earlier=earlier_result)
            tr = translate(error, allowed_args=c.spec.arg_names, sanitize=self.safeguards.sanitize, hints=self.error_hints)
            await _undo_savepoint(conn)
            failed = _failed(c.index, c.call_id, c.name, tr)
            failed.latency_ms = latency_ms
            return _Step(failed, earlier=earlier_result)
        result, content = applied
        done = CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result, latency_ms=latency_ms)
        if folded:
            return _Step(earlier=earlier_result, unanswered=_Unanswered(c, done, release))
        return _Step(done, ended=True if commit else None, earlier=earlier_result)

    async def _earlier_failed(self, conn, earlier: "_Unanswered", error: Exception | None) -> CallResult:
        """``earlier``'s ledger row or RELEASE failed (the pipeline has been synced): undo its savepoint and
        answer it FAILED with ``error`` when that is the server's (it holds a SQLSTATE). Without one, the
        next call's tool caught the server's error and raised its own or none: ``earlier`` is answered
        ``FAILED [internal]``, the events keep what happened."""
        if getattr(error, "sqlstate", None) is None:
            unknown = psycopg.Error("a statement of this call sent after its tool returned failed (its ledger row, "
                                    "its RELEASE or a statement whose result the tool did not read); the next "
                                    "call's tool caught the server's error")
            unknown.__cause__ = error
            error = unknown
        c = earlier.call
        await _undo_savepoint(conn)
        failed = _failed(c.index, c.call_id, c.name,
                         translate(error, allowed_args=c.spec.arg_names, sanitize=self.safeguards.sanitize,
                                   hints=self.error_hints))
        failed.latency_ms = earlier.result.latency_ms
        return failed

    async def _settle_unanswered(self, conn, pipe: "_Pipeline", earlier: "_Unanswered") -> CallResult:
        """End the pipeline and settle ``earlier`` (no call came after it to carry its answers)."""
        raised = await pipe.sync()
        error = _aborted(raised) if isinstance(raised, psycopg.errors.PipelineAborted) and not conn.broken else raised
        if error is not None and (conn.broken or is_infrastructure(error)):
            raise error
        if earlier.answered:
            return earlier.result
        return await self._earlier_failed(conn, earlier, raised)

    async def _call(self, conn, c: _Call, thread_id: str, tenant_id: str | None, attempt: int) -> CallResult:
        """Run one call's handler and ledger insert on ``conn``, without a savepoint (the first draft):
        APPLIED, or FAILED with its translated reason. An infrastructure error is raised (the graph's
        retry policy decides)."""
        if self.hooks.before_call:
            await run_hooks(self.hooks.before_call, c, c.index)
        t0 = time.perf_counter()
        ctx = ToolContext(thread_id, c.call_id, self.safeguards, self.provider, tenant_id)
        try:
            result, content = await self._apply(conn, c, ctx, thread_id, attempt)
        except Exception as exc:
            tr = translate(exc, allowed_args=c.spec.arg_names, sanitize=self.safeguards.sanitize, hints=self.error_hints)
            if tr.infrastructure:
                raise
            failed = _failed(c.index, c.call_id, c.name, tr)
            failed.latency_ms = (time.perf_counter() - t0) * 1000
            return failed
        return CallResult(c.index, c.call_id, c.name, Outcome.APPLIED, content, result=result,
                          latency_ms=(time.perf_counter() - t0) * 1000)

    async def _end(self, conn, stop: bool) -> Translation | None:
        """COMMIT (or ROLLBACK when ``stop``); the translated reason when COMMIT itself failed, e.g. a
        deferred constraint (case C12). The server turns COMMIT of an aborted transaction into ROLLBACK."""
        try:
            await conn.execute(ROLLBACK if stop else COMMIT)
        except psycopg.Error as exc:
            commit_failed = translate(exc, sanitize=self.safeguards.sanitize, hints=self.error_hints)
            if commit_failed.infrastructure:
                raise
            return commit_failed
        return None

    def _commit_failed(self, runnable: list[_Call], results: dict[int, CallResult], pending: dict[int, CallResult],
                       ran_ok: set[int], commit_failed: Translation, thread_id: str, attempt: int) -> None:
        """The server rolled the whole batch back at COMMIT: no call of it is applied."""
        ran_ok.clear()
        self.events.record("tools", "commit_failed", thread_id=thread_id, attempt=attempt,
                           sqlstate=commit_failed.sqlstate, error_class=commit_failed.error_class,
                           detail=commit_failed.detail)
        for c in runnable:
            r = results.get(c.index) or pending.get(c.index)
            if r is None or r.outcome is Outcome.APPLIED:
                results[c.index] = _commit_failed(c, commit_failed)

    @staticmethod
    def _key(thread_id: str, tenant_id: str | None, c: _Call) -> str:
        return idempotency_key(thread_id, c.call_id, tenant_id=tenant_id, occurrence=c.occurrence)

    async def _apply(self, conn, c: _Call, ctx: ToolContext, thread_id: str, attempt: int) -> tuple[dict, str]:
        """Run one call's handler and (with the ledger on) insert its ledger row; its result and the result's
        JSON text (the ToolMessage content, also the ledger's stored result)."""
        result = await c.spec.handler(conn, c.args, ctx)
        content = result_content(result)
        if self.safeguards.ledger:
            await conn.execute(LEDGER_INSERT, (
                self._key(thread_id, ctx.tenant_id, c), ctx.tenant_id, thread_id, c.call_id, c.occurrence, c.name,
                json.dumps(c.args, default=str), content, attempt,
            ))
        return result, content

    async def _run_autocommit(self, runnable: list[_Call], results: dict[int, CallResult], ran_ok: set[int],
                              thread_id: str, tenant_id: str | None, attempt: int) -> None:
        """No transaction: every statement commits on its own, as in a first draft."""
        sg = self.safeguards
        async with self.pool.connection() as conn:
            if sg.schema != STRICT_SCHEMA:
                await conn.execute(SET_SEARCH_PATH, (f"{sg.schema}, public",))
            try:
                for c in runnable:
                    if self.hooks.before_call:
                        await run_hooks(self.hooks.before_call, c, c.index)
                    t0 = time.perf_counter()
                    ctx = ToolContext(thread_id, c.call_id, sg, self.provider, tenant_id)
                    try:
                        result = await c.spec.handler(conn, c.args, ctx)
                    except Exception as exc:
                        tr = translate(exc, allowed_args=c.spec.arg_names, sanitize=sg.sanitize, hints=self.error_hints)
                        if tr.infrastructure:
                            raise
                        results[c.index] = _failed(c.index, c.call_id, c.name, tr)
                        continue
                    finally:
                        latency = (time.perf_counter() - t0) * 1000
                    results[c.index] = CallResult(c.index, c.call_id, c.name, Outcome.APPLIED,
                                                  result_content(result), result=result, latency_ms=latency)
                    ran_ok.add(c.index)
                    if self.hooks.after_call:
                        await run_hooks(self.hooks.after_call, c, c.index)
            finally:
                if sg.schema != STRICT_SCHEMA and not conn.closed:
                    try:
                        await conn.execute(RESET_SEARCH_PATH)
                    except psycopg.Error:
                        pass  # a broken connection is discarded by the pool

    async def _resolve_after_loss(self, runnable: list[_Call], results: dict[int, CallResult], thread_id: str,
                                  tenant_id: str | None, tr: Translation, exc: BaseException) -> None:
        """Last attempt after an infrastructure error: the ledger, read on a fresh connection, says
        which calls committed (a connection lost during COMMIT); everything else is NOT APPLIED."""
        stored: dict[str, Any] = {}
        if self.safeguards.ledger:
            keys = [self._key(thread_id, tenant_id, c) for c in runnable]
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(LEDGER_LOOKUP, (keys,))
                    stored = {k: v for k, v in await cur.fetchall()}
            except Exception:
                raise exc  # cannot tell what committed: fail the run; a resume will read the ledger
        for c in runnable:
            key = self._key(thread_id, tenant_id, c)
            if key in stored:
                results[c.index] = CallResult(c.index, c.call_id, c.name, Outcome.REPLAYED,
                                              result_content(stored[key]), result=stored[key])
            else:
                results[c.index] = _not_applied(c.index, c.call_id, c.name, tr.reason)
                results[c.index].translation = tr

    # ------------------------------------------------------------------ LangGraph node

    def as_node(self) -> Callable:
        """The LangGraph node function: reads the last AIMessage's tool calls, writes ToolMessages and
        the rollback counters. The thread id (and tenant) come from ``config["configurable"]``.

        Calls already answered by a ToolMessage after that AIMessage (a reviewer's rejection, see
        :mod:`agentlab.durable.approval`) are skipped: each tool call id gets exactly one ToolMessage.

        Tool call ids the model got wrong:

        - no id (None or ``""``, case C15): the call gets :func:`agentlab.core.messages.synthetic_call_id`,
          derived from the AIMessage's own id and the call's position, and the node writes the AIMessage
          back with it (same message id, so ``add_messages`` replaces it): every retry, resume and replay
          sees the same id, and the ledger replays instead of applying twice;
        - arguments that were not valid JSON (``AIMessage.invalid_tool_calls``, case C16): each gets one
          ``FAILED [invalid_arguments]``; the batch policy treats it as a failed call;
        - one id reused on every turn (case C17): the kit *accepts* reused ids. The ledger key holds the
          call's occurrence, the number of earlier AIMessages of the thread holding the same id. A node
          retry, a resume after a crash or a replay of a checkpoint re-runs the *same* AIMessage after
          the same history, so it gets the same key and the stored result; a later turn that reuses the
          id is a new call with a new key and is applied. (Refusing reused ids instead would strand
          models such as llama.cpp's constant id or Kimi's ``functions.NAME:0`` numbering.)
        """

        async def tools(state: dict, config: RunnableConfig, runtime: Runtime) -> dict:
            messages = list(state["messages"])
            at = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
            fixed = with_call_ids(messages[at]) if at is not None else None
            if fixed is not None:
                messages[at] = fixed
            tool_calls, invalid = (list(messages[at].tool_calls),
                                   list(messages[at].invalid_tool_calls)) if at is not None else ([], [])
            if at is not None and at < len(messages) - 1:  # some calls were answered already (rejected)
                answered = next(replies for i, _, replies in batches(messages) if i == at)
                tool_calls = [tc for tc in tool_calls if tc.get("id") not in answered]
                invalid = [tc for tc in invalid if tc.get("id") not in answered]
            conf = config.get("configurable", {})
            info = getattr(runtime, "execution_info", None)
            attempt = getattr(info, "node_attempt", 1) or 1
            thread_id = str(conf.get("thread_id", "default"))
            batch = await self.run_batch(
                tool_calls, thread_id=thread_id, tenant_id=await self.thread_tenant(thread_id, conf.get("tenant_id")),
                attempt=attempt, final_attempt=attempt >= self.max_attempts, invalid_tool_calls=invalid,
                occurrence=occurrences(messages, at) if at is not None else None,
                run_token=conf.get(RUN_TOKEN_KEY) if self.safeguards.run_lock else None,
            )
            return {
                "messages": ([fixed] if fixed is not None else []) + batch.messages,
                "rollbacks": (state.get("rollbacks", 0) + 1) if batch.rolled_back else 0,
                "rollbacks_total": state.get("rollbacks_total", 0) + int(batch.rolled_back),
            }

        return tools

    async def thread_tenant(self, thread_id: str, configured: str | None) -> str | None:
        """The tenant a batch of ``thread_id`` runs for: ``configured`` (the graph config's) when given, else
        the tenant the thread's first batch bound it to (``thread_tenants``), else None.

        A config LangGraph hands back (``get_state_history`` snapshots, ``aupdate_state`` results) carries
        only thread, namespace and checkpoint id; replaying it must run for the thread's own tenant (case
        C25). The tenant never comes from the model. A configured tenant that differs from the bound one
        is refused by the batch itself (:class:`agentlab.core.isolation.TenantMismatch`)."""
        if configured is not None:
            return configured
        async with self.pool.connection() as conn:
            row = await (await conn.execute(THREAD_TENANT, (thread_id,))).fetchone()
        return row[0] if row else None


async def _rollback_quietly(conn) -> None:
    """End the batch's transaction after an exception (the exception is what the caller sees): ROLLBACK
    when the connection is still in a transaction; a broken connection is discarded by the pool. A pipeline
    may have failed or been cancelled: psycopg's prepared statements are forgotten first
    (:func:`agentlab.core.prepared.forget_prepared`)."""
    forget_prepared(conn)
    if conn.closed or conn.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    try:
        await conn.execute(ROLLBACK)
    except psycopg.Error as exc:
        log.warning("ROLLBACK after a failed batch failed too: %s", exc)


async def _undo_savepoint(conn) -> None:
    """ROLLBACK TO the call's savepoint and RELEASE it, pipelined (one round trip): the call is undone, the
    transaction usable again. A failure is logged (the call's own error is what the model is told) and
    leaves the transaction aborted, so the later calls meet SQLSTATE 25P02; a lost connection is raised.

    The call's pipeline failed, so the server skipped its statements after the error, the Parse of any
    statement psycopg was preparing there included: psycopg's prepared statements are forgotten first
    (:func:`agentlab.core.prepared.forget_prepared`; its DEALLOCATE ALL goes in this round trip), and again
    when this pipeline fails."""
    forget_prepared(conn)
    try:
        async with conn.pipeline():
            await conn.execute(ROLLBACK_TO_SAVEPOINT)
            await conn.execute(RELEASE_SAVEPOINT)
    except Exception as exc:
        forget_prepared(conn)
        if conn.broken or is_infrastructure(exc):
            raise
        log.warning("ROLLBACK TO the failed call's savepoint failed: %s", exc)


def _aborted(exc: psycopg.errors.PipelineAborted) -> psycopg.errors.InFailedSqlTransaction:
    """What the server says outside a pipeline to a statement sent after an error in the same transaction
    (SQLSTATE 25P02), for a tool that caught its statement's error and went on: inside a pipeline the
    server skips that statement and psycopg raises ``PipelineAborted``, which carries no SQLSTATE."""
    aborted = psycopg.errors.InFailedSqlTransaction(
        "current transaction is aborted, commands ignored until end of transaction block")
    aborted.__cause__ = exc
    return aborted


class _FatalNotice:
    """A notice handler keeping the last FATAL or PANIC report: the server's reason for closing the connection.

    Outside a pipeline libpq hands a terminated backend's ``FATAL`` message to the waiting statement as its
    error (``AdminShutdown``, SQLSTATE 57P01); inside one it arrives while no result is awaited, and libpq
    passes it to the notice handlers instead."""

    def __init__(self) -> None:
        self.sqlstate: str | None = None
        self.message: str | None = None

    def __call__(self, diag) -> None:  # diag is valid during the call only: its fields are copied
        if (diag.severity_nonlocalized or diag.severity) in ("FATAL", "PANIC") and diag.sqlstate:
            self.sqlstate, self.message = diag.sqlstate, diag.message_primary


def _lost(conn, exc: Exception, fatal: _FatalNotice) -> psycopg.OperationalError | None:
    """The error a lost connection raises outside a pipeline, for ``exc`` raised inside one; None when the
    connection is alive or ``exc`` already is that error.

    Outside a pipeline psycopg reports a terminated backend as the server's own error (``AdminShutdown``,
    SQLSTATE 57P01: "terminating connection due to administrator command") and a vanished server as a
    :class:`psycopg.OperationalError`; the translator retries both. Inside a pipeline the same loss comes as
    "consuming input failed", ``PipelineAborted`` for the statements never answered, or a protocol error,
    while the server's reason went to the notice handlers (``fatal``). Here it becomes the error the server
    sent (the psycopg class of its SQLSTATE, with its message), else an ``OperationalError`` with the text
    psycopg gave (the caller chains ``exc``)."""
    if not (conn.closed or conn.broken):
        return None
    if fatal.sqlstate is not None and getattr(exc, "sqlstate", None) != fatal.sqlstate:
        try:
            cls = psycopg.errors.lookup(fatal.sqlstate)
        except KeyError:  # a SQLSTATE psycopg has no class for
            cls = None
        if cls is not None and issubclass(cls, psycopg.OperationalError):
            return cls(fatal.message or str(exc))
    if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.PipelineAborted):
        return None
    return psycopg.OperationalError(f"the connection was lost: {exc}")


def _as_json(value: Any) -> Any:
    """``value`` as the ledger's JSONB gives it back (dates as ISO text), for comparing arguments."""
    return json.loads(json.dumps(value, default=str))


@dataclass
class _Unanswered:
    """A call whose tool returned, its ledger row and RELEASE queued in the batch's pipeline, not yet answered."""

    call: _Call
    result: CallResult  # APPLIED, once its RELEASE is answered
    release: Any  # the RELEASE's cursor: psycopg sets its pgresult when the server's answer is read

    @property
    def answered(self) -> bool:
        """True once the RELEASE succeeded: every statement of the call did. After a Sync, False means one failed."""
        return self.release.pgresult is not None


@dataclass
class _Step:
    """What :meth:`TransactionalToolsNode._call_in_savepoint` settled: the call's result (None when the call
    is ``unanswered`` or must run ``again``), its COMMIT (see there), and the earlier call's outcome."""

    result: CallResult | None = None
    ended: Translation | bool | None = None
    earlier: CallResult | None = None
    unanswered: _Unanswered | None = None
    again: bool = False


class _Pipeline:
    """The pipeline (psycopg's pipeline mode) the batch's calls share: entered by a call's first statement,
    left by the Sync :meth:`sync` sends; calls may follow each other in it between the two."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self._open = None

    async def enter(self) -> None:
        if self._open is None:
            cm = self.conn.pipeline()
            await cm.__aenter__()
            self._open = cm

    async def sync(self) -> Exception | None:
        """Leave the pipeline: its Sync goes out and every answer is read. Returns the first error the answers
        held (psycopg raises it on leaving; here it is returned), None when none did or no pipeline was open."""
        cm, self._open = self._open, None
        if cm is None:
            return None
        try:
            await cm.__aexit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 (the caller attributes it)
            return exc
        return None


class _Duplicate(Exception):
    pass
