"""The transactional tools node: prepare -> strategy.run -> answer every call id -> events.

Under the ``full`` preset a batch (the tool calls of one ``AIMessage``) runs like this:

1. every call is validated first (:func:`agentlab.core.batch.calls.prepare`: unknown tool, duplicate id,
   argument model); under the atomic policy one invalid call means no SQL is sent at all;
2. the calls that may run go to a :class:`~agentlab.core.batch.strategy.BatchStrategy`: on the safe path
   one short transaction (``pg_advisory_xact_lock`` on the thread, local timeouts, the agent role and the
   thread's tenant), one ledger look-up for the batch, a SAVEPOINT per call holding the call's SQL and its
   ledger row, COMMIT, and nothing reported applied before COMMIT returned
   (:mod:`agentlab.core.batch.savepoints`, the reference; :mod:`agentlab.core.batch.pipelined`, the same
   statements in fewer round trips);
3. exactly one ToolMessage per tool call id, in call order: the result, ``FAILED [...]`` with a sanitized
   reason, or ``NOT APPLIED: ...``; one event per call.

Infrastructure errors (lost connection, killed backend, busy lock: see
:func:`agentlab.core.errors.is_infrastructure`) are raised so that the graph's RetryPolicy re-runs the
node; on the last attempt the node answers instead, and a connection lost during COMMIT is resolved by
reading the ledger on a fresh connection (:meth:`TransactionalToolsNode.resolve_after_loss`), never by a
blind retry.

Sources: PostgreSQL docs "SAVEPOINT", "Advisory Locks"; psycopg docs "Transactions management"; LangGraph
"RetryPolicy".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime

from agentlab.core.batch.budgets import CallBudgets
from agentlab.core.batch.calls import Call, prepare
from agentlab.core.batch.choice import strategy_for
from agentlab.core.batch.ledger import LEDGER_LOOKUP
from agentlab.core.batch.opening import THREAD_TENANT
from agentlab.core.batch.results import BatchResult, CallResult, Outcome, Settled, not_applied
from agentlab.core.batch.savepoints import SAVEPOINT_NAME
from agentlab.core.batch.strategy import Batch, BatchStrategy, NodeHooks
from agentlab.core.errors import Category, ErrorHints, Translation, translate
from agentlab.core.events import EventLog
from agentlab.core.hooks import run_hooks
from agentlab.core.isolation import require_tenant
from agentlab.core.messages import (
    BATCH_ROLLED_BACK,
    CHANGED_AFTER_APPROVAL,
    FAILED_TEMPLATE,
    args_hash,
    batches,
    occurrences,
    with_call_ids,
)
from agentlab.core.run_lock import DEFAULT_TTL_MS, RUN_TOKEN_KEY
from agentlab.core.safeguards import Policy, Safeguards
from agentlab.core.toolspec import Toolset, result_content
from agentlab.core.tracing import record_batch


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
        strategy: how the calls run (:mod:`agentlab.core.batch.strategy`); None: the one
            :func:`agentlab.core.batch.choice.strategy_for` picks for ``safeguards``.
        call_budgets: tool-call budgets per thread and per run, kept in the database and spent in the batch
            (:mod:`agentlab.core.batch.budgets`); None: no limit.

    Raises:
        DomainError: ``call_budgets`` names a tool that ``toolset`` lacks.
    """

    def __init__(self, pool, safeguards: Safeguards, *, toolset: Toolset, provider=None,
                 events: EventLog | None = None, max_attempts: int = 3, error_hints: ErrorHints | None = None,
                 strategy: BatchStrategy | None = None, call_budgets: CallBudgets | None = None):
        if call_budgets is not None:
            call_budgets.check_tools(toolset)
        self.pool = pool
        self.safeguards = safeguards
        self.toolset = toolset
        self.provider = provider
        self.events = events or EventLog(None)
        self.max_attempts = max_attempts
        self.error_hints = error_hints
        self.strategy = strategy or strategy_for(safeguards)
        self.call_budgets = call_budgets
        self.lease_ttl_ms = DEFAULT_TTL_MS  # how long each batch renews its run's thread lease for
        self.hooks = NodeHooks()

    async def run_batch(self, tool_calls: Sequence[Mapping[str, Any]], *, thread_id: str,
                        tenant_id: str | None = None, attempt: int = 1, final_attempt: bool = False,
                        invalid_tool_calls: Sequence[Mapping[str, Any]] = (),
                        occurrence: Mapping[str, int] | None = None, run_token: str | None = None,
                        run_id: str | None = None) -> BatchResult:
        """Run one batch and return one result per distinct tool call id, in call order.

        Args:
            tool_calls: ``AIMessage.tool_calls`` (dicts with ``name``, ``args``, ``id``).
            thread_id, tenant_id: the thread and its tenant (from the graph config, never from the model).
            attempt, final_attempt: the node's attempt under the RetryPolicy.
            invalid_tool_calls: ``AIMessage.invalid_tool_calls`` (arguments that were not valid JSON): each
                is answered ``FAILED [invalid_arguments]`` and counts as a failed call of the batch.
            occurrence: per call id, how many earlier AIMessages of the thread hold it (see
                :func:`agentlab.core.batch.ledger.idempotency_key`); 0 when missing.
            run_token: the owner token of the run's thread lease (:mod:`agentlab.core.run_lock`); the
                batch renews the lease as its first statement and is refused when the run lost it.
            run_id: the run its per-run budgets count under (``configurable["run_id"]``); None: the thread.

        A call without an id (None or ``""``) is refused with ``FAILED [invalid_arguments]`` naming the
        missing id; :meth:`as_node` never sends one, it gives such calls a stable synthetic id first.

        Raises:
            Exception: an infrastructure error (see :func:`agentlab.core.errors.is_infrastructure`) unless
                ``final_attempt``; the batch is then rolled back and the graph retries the node.
            agentlab.core.isolation.TenantRequired: isolation is on and ``tenant_id`` is missing (before any SQL).
            agentlab.core.run_lock.LeaseLost: ``run_token`` no longer holds the thread (rolled back, no tool SQL).
        """
        sg = self.safeguards
        if sg.isolation:
            require_tenant(tenant_id)
        calls, results = prepare(tool_calls, invalid_tool_calls, toolset=self.toolset, safeguards=sg,
                                 occurrence=occurrence, error_hints=self.error_hints)
        runnable = [c for c in calls if c.index not in results]
        if results and sg.policy is Policy.ATOMIC:
            runnable = []  # one bad call: no SQL at all
        settled = Settled(rolled_back=bool(results) and sg.policy is Policy.ATOMIC)
        if runnable:
            batch = Batch(self.pool, sg, thread_id, tenant_id, attempt, run_token, self.lease_ttl_ms, self.provider,
                          self.hooks, self.events, self.error_hints, self.call_budgets, run_id)
            try:
                settled = await self.strategy.run(batch, runnable)
                if settled.applied and not settled.rolled_back:
                    await run_hooks(self.hooks.after_commit, list(tool_calls))
            except Exception as exc:
                tr = translate(exc, sanitize=sg.sanitize, hints=self.error_hints)
                if not tr.infrastructure:
                    raise
                self.events.record("tools", "infrastructure_error", thread_id=thread_id, sqlstate=tr.sqlstate,
                                   error_class=tr.error_class, detail=tr.detail, attempt=attempt)
                if not final_attempt:
                    raise
                settled = await self.resolve_after_loss(batch, runnable, tr, exc)
        results.update(settled.results)
        return await self.answer(calls, results, settled.rolled_back, thread_id, attempt)

    async def answer(self, calls: list[Call], results: dict[int, CallResult], rolled_back: bool, thread_id: str,
                     attempt: int) -> BatchResult:
        """Answer every call id in call order (a call that never ran: NOT APPLIED) and record one event per call."""
        for c in calls:
            if c.index not in results:
                results[c.index] = not_applied(c.index, c.call_id, c.name, BATCH_ROLLED_BACK)
        if not rolled_back and self.safeguards.policy is Policy.PARTIAL:  # nothing kept and something failed
            outcomes = {r.outcome for r in results.values()}
            rolled_back = bool(results) and not outcomes & {Outcome.APPLIED, Outcome.REPLAYED} \
                and Outcome.FAILED in outcomes
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

    async def resolve_after_loss(self, batch: Batch, calls: list[Call], tr: Translation,
                                 exc: BaseException) -> Settled:
        """Last attempt after an infrastructure error: the ledger, read on a fresh connection, says which
        calls committed (a connection lost during COMMIT); everything else is NOT APPLIED. Raises ``exc``
        when the ledger cannot be read (a resume will read it)."""
        stored: dict[str, Any] | None = {}
        if self.safeguards.ledger:
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(LEDGER_LOOKUP, ([batch.key(c) for c in calls],))
                    stored = {k: v for k, v in await cur.fetchall()}
            except Exception:
                stored = None
        if stored is None:
            raise exc
        results: dict[int, CallResult] = {}
        for c in calls:
            if (key := batch.key(c)) in stored:
                results[c.index] = CallResult(c.index, c.call_id, c.name, Outcome.REPLAYED,
                                              result_content(stored[key]), result=stored[key])
            else:
                results[c.index] = not_applied(c.index, c.call_id, c.name, tr.reason)
                results[c.index].translation = tr
        replayed = any(r.outcome is Outcome.REPLAYED for r in results.values())
        return Settled(results, rolled_back=not replayed)

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
            changed = self.changed_since_approval(state, messages[at] if at is not None else None, tool_calls)
            tool_calls = [tc for tc in tool_calls if tc not in changed]
            conf = config.get("configurable", {})
            info = getattr(runtime, "execution_info", None)
            attempt = getattr(info, "node_attempt", 1) or 1
            thread_id = str(conf.get("thread_id", "default"))
            batch = await self.run_batch(
                tool_calls, thread_id=thread_id, tenant_id=await self.thread_tenant(thread_id, conf.get("tenant_id")),
                attempt=attempt, final_attempt=attempt >= self.max_attempts, invalid_tool_calls=invalid,
                occurrence=occurrences(messages, at) if at is not None else None,
                run_token=conf.get(RUN_TOKEN_KEY) if self.safeguards.run_lock else None,
                run_id=conf.get("run_id"),
            )
            record_batch(config, batch, thread_id=thread_id,  # its spans, when the run is traced
                         savepoint=SAVEPOINT_NAME if self.safeguards.savepoints else None)
            return {
                "messages": ([fixed] if fixed is not None else []) + [
                    self.changed_message(tc, thread_id) for tc in changed] + batch.messages,
                "rollbacks": (state.get("rollbacks", 0) + 1) if batch.rolled_back else 0,
                "rollbacks_total": state.get("rollbacks_total", 0) + int(batch.rolled_back),
            }

        return tools

    @staticmethod
    def changed_since_approval(state: Mapping[str, Any], message: AIMessage | None,
                               tool_calls: list[dict]) -> list[dict]:
        """The calls of ``message`` that a reviewer approved or edited (``state["approved"]``, written by
        :mod:`agentlab.durable.approval`) and whose name and arguments no longer hash to what was decided:
        changed after the decision (a state update that skipped the approval). They are not run."""
        approved = state.get("approved") or {}
        if message is None or not message.id or approved.get("message_id") != message.id:
            return []
        decided = approved.get("calls") or {}
        return [tc for tc in tool_calls if tc.get("id") in decided and args_hash(tc) != decided[tc["id"]]]

    def changed_message(self, call: Mapping[str, Any], thread_id: str) -> ToolMessage:
        """The answer of a call changed after its approval: ``FAILED [rejected]``, :data:`CHANGED_AFTER_APPROVAL`."""
        self.events.record("tools", "failed", kind="call", thread_id=thread_id, tool_name=call.get("name"),
                           tool_call_id=call.get("id"), category=Category.REJECTED.value)
        return ToolMessage(FAILED_TEMPLATE.format(category=Category.REJECTED.value, reason=CHANGED_AFTER_APPROVAL),
                           tool_call_id=call["id"], name=call.get("name"), status="error",
                           artifact={"outcome": "failed", "category": Category.REJECTED.value})

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
