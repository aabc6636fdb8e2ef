"""Human approval with ``interrupt()``: refunds above a threshold wait for a person.

With an :class:`ApprovalPolicy`, :func:`agentlab.core.graph.build_graph` puts an ``approve`` node between
``agent`` and ``tools``. For the calls of the last AIMessage that the policy names (by default
``QueueRefund`` with ``amount_cents`` above :data:`DEFAULT_THRESHOLD_CENTS`):

1. before ``interrupt()``: one approval request for the whole batch, listing each call, is stored
   with ``INSERT ... ON CONFLICT DO NOTHING`` under a key derived from thread, node and super-step
   (``langgraph_step`` in the config's metadata), plus the checkpoint the step started from, so that
   sibling branches of a fork get requests of their own (:func:`request_key`). LangGraph re-executes
   the node from its start on resume, so this is the only write allowed there: one that a second
   run leaves unchanged (case C05).
2. ``interrupt(request)`` pauses the thread; the checkpoint holds it, for days if need be.
3. the resume, ``Command(resume={tool_call_id: "approve" | "reject", ...})`` (or one word for every
   call), answers each call by its tool call id. Anything but ``"approve"``, and a call the resume
   does not name, counts as rejected: the safe default. The decisions are stored once (a guarded
   ``UPDATE ... WHERE status = 'pending'``, under the same key). An answer binds to what the reviewer
   saw (case C22): each request row records the interrupt at which it was shown (``shown_at``), and
   an answer decides only calls that a pending, shown request of the thread listed exactly (same
   ids, tools and arguments). A call edited while it waited (``aupdate_state`` under the same id) is
   not decided by the answer given to the old request; the thread stops again on a new one. Each listed call carries ``args_sha256`` (:func:`args_hash`); an answer may name it,
   and the request key, to bind explicitly (:func:`decisions_from`).
4. each rejected call gets its ToolMessage here, ``FAILED [rejected]`` with
   :data:`agentlab.core.errors.REJECTED_BY_REVIEWER` (and the reviewer's reason when one was given,
   :func:`reject_call`), which the scripted model reads as "drop it"; the tools node then runs only the
   approved calls still without a ToolMessage (case C06). When every call was rejected, the run goes
   straight back to ``agent``.

Approve, edit, reject (as LangChain's human-in-the-loop middleware offers). A decision may also be
``{"decision": "edit", "args": {...}, "args_sha256": hash}`` (:func:`edit_call`): the new arguments are
validated like any call (the tool's strict argument model, storable text), and the edit is bound to the
call the reviewer saw (``args_sha256`` must be that call's, as for an explicit approve; otherwise it counts
as a rejection). An edit that fails validation decides nothing: the node stops again on the same request,
with ``errors`` (``{tool_call_id: reason}``) for the reviewer, and nothing is recorded. A valid edit
replaces the call's arguments in the AIMessage (same message id, same tool call id), so the call the tools
node runs is exactly the edited one; its hash (:func:`args_hash` of tool and edited arguments) is recorded.
The decisions are recorded with who decided (``{"decisions": ..., "reviewer": name}``, see
:func:`resume_command`) and when, in ``approval_requests.decided_by``, ``decided_at`` and
``decision_details`` (``{tool_call_id: {"decision", "args_sha256", "args"?, "message"?}}``;
:func:`approval_decisions`). The ``decisions`` column keeps its ``{tool_call_id: word}`` shape.

The side effect itself (the refund) happens after approval, in the tools node, under the ledger's
key (tenant, thread, tool call id, occurrence); the payment leaves through the outbox under its
natural key. So a
resume days later, after the provider has forgotten its idempotency keys, still pays once: the
outbox row exists once and the worker looks the payment up by that key before paying. (The refund
is not keyed by thread, node and step: that key names *the approval*, and two different calls
approved in one batch share it.)

A call holding text the database cannot store (a NUL byte) never becomes a request: it is answered
``FAILED [invalid_arguments]`` (case C21, :mod:`agentlab.core.storable`).

Here: the policy and its ``approve`` node (:class:`ApprovalPolicy`), and the approval story for a notebook
(:data:`APPROVAL`, :func:`resume_days_later`). Reading a resume value as one decision per call (step 3,
edits validated) is :mod:`agentlab.durable.approval_answers`; the reviewer's side outside the graph (the
requests a run waits on, :func:`resume_command`, the stored requests and decisions as DataFrames) is
:mod:`agentlab.durable.approval_review`. Their names stay importable from here.

Sources: LangGraph docs "Interrupts" (re-execution on resume, "side effects before interrupt must be
idempotent", resuming with ``Command(resume=...)``); Stripe "Idempotent requests" (24 h key retention).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from agentlab.core.errors import Category
from agentlab.core.messages import FAILED_TEMPLATE, REJECTED_BY_REVIEWER, REVIEWER_SAID, args_hash
from agentlab.core.storable import UNSTORABLE_REASON, storable_text, unstorable_path
from agentlab.domains.billing.scenarios import C, CustomerSpec, Intended, PlannedCall, Scenario
from agentlab.durable.approval_answers import (  # noqa: F401 (moved there; importable from here as before)
    APPROVE,
    EDIT,
    MAX_REASON_CHARS,
    REJECT,
    Answer,
    Decision,
    decisions_from,
    edit_call,
    edit_errors,
    edited_message,
    read_answer,
    reject_call,
)
from agentlab.durable.approval_review import (  # noqa: F401 (moved there; importable from here as before)
    LIST_DECISIONS,
    LIST_REQUESTS,
    approval_decisions,
    approval_requests,
    interrupts_of,
    pending_requests,
    resume_command,
)

DEFAULT_THRESHOLD_CENTS = 10_000  # refunds above 100.00 need a person
APPROVAL_NODE = "approve"
REJECTED_MESSAGE = FAILED_TEMPLATE.format(category=Category.REJECTED.value, reason=REJECTED_BY_REVIEWER)

INSERT_REQUEST = """
INSERT INTO approval_requests (request_key, thread_id, node, step, calls) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (request_key) DO NOTHING
"""
RECORD_DECISIONS = """
UPDATE approval_requests SET status = 'decided', decisions = %(decisions)s, decision_details = %(details)s,
                             decided_by = %(reviewer)s, decided_at = now()
WHERE request_key = %(key)s AND status = 'pending'
"""
SHOWN_AT = """
SELECT shown_at FROM approval_requests
WHERE thread_id = %s AND node = %s AND calls = %s::jsonb AND status = 'pending' AND shown_at IS NOT NULL
ORDER BY requested_at DESC LIMIT 1
"""
MARK_SHOWN = "UPDATE approval_requests SET shown_at = %s WHERE request_key = %s AND shown_at IS NULL"


def request_key(thread_id: str, node: str, step: int | None, checkpoint_id: str | None = None) -> str:
    """The approval request's idempotency key: ``thread_id:node:langgraph_step[:checkpoint_id]``.

    Stable across the node's re-executions in one super-step (the re-run on resume starts from the
    same checkpoint), distinct for the next batch of the thread (a later super-step) and for each
    branch a replay or fork starts (sibling branches can share a step number, never a checkpoint).
    """
    return f"{thread_id}:{node}:{step}" + (f":{checkpoint_id}" if checkpoint_id else "")


def last_batch(messages: list[AnyMessage]) -> tuple[list[dict], set[str]]:
    """The last AIMessage's tool calls and the ids already answered by a ToolMessage after it."""
    at = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if at is None:
        return [], set()
    answered = {m.tool_call_id for m in messages[at + 1:] if isinstance(m, ToolMessage)}
    return list(messages[at].tool_calls), answered


def _answers(answer: Any, request: Mapping[str, Any], index: int, shown_at: int | None, *, bound: bool) -> bool:
    """Whether the ``index``-th resume value of a node run answers ``request``: an answer naming a
    request key answers that request only; otherwise (with a pool) only the value given at the
    interrupt where the request was shown; without a pool, any."""
    if isinstance(answer, Mapping) and "request_key" in answer and "decisions" in answer:
        return answer["request_key"] == request.get("request_key")
    return not bound or shown_at == index


def _valid(toolset, call: Mapping[str, Any]) -> bool:
    try:
        toolset.get_tool(call.get("name")).validate(call.get("args"))
    except Exception:
        return False
    return True


def unstorable_message(call: dict) -> ToolMessage:
    """The ToolMessage of a call holding text the database cannot store (no request is made for it)."""
    where = unstorable_path({"args": call.get("args")}) or ""
    field = f"argument '{where.removeprefix('args.')}'" if where.startswith("args.") else "this call"
    return ToolMessage(FAILED_TEMPLATE.format(category=Category.INVALID_ARGUMENTS.value,
                                              reason=f"{storable_text(field)}: {UNSTORABLE_REASON}."),
                       tool_call_id=storable_text(str(call["id"])), name=call.get("name"), status="error",
                       artifact={"outcome": "failed", "category": Category.INVALID_ARGUMENTS.value})


def rejected_message(call: dict, message: str | None = None) -> ToolMessage:
    """The ToolMessage of a call a reviewer rejected (model-facing text: :data:`REJECTED_MESSAGE`, followed by
    the reviewer's reason ``message`` when given: :data:`agentlab.core.messages.REVIEWER_SAID`)."""
    content = REJECTED_MESSAGE if message is None else REVIEWER_SAID.format(rejected=REJECTED_MESSAGE,
                                                                            message=message)
    return ToolMessage(content, tool_call_id=call["id"], name=call.get("name"), status="error",
                       artifact={"outcome": "failed", "category": Category.REJECTED.value})


@dataclass(frozen=True)
class ApprovalPolicy:
    """Which tool calls need a person's approval.

    Args:
        threshold_cents: calls whose ``amount_arg`` is above this many cents need approval.
        tools: the tool names the rule applies to.
        amount_arg: the argument holding the amount, in cents.
        node: the approval node's name (part of the request key).
    """

    threshold_cents: int = DEFAULT_THRESHOLD_CENTS
    tools: tuple[str, ...] = ("QueueRefund",)
    amount_arg: str = "amount_cents"
    node: str = APPROVAL_NODE

    def needs_approval(self, call: Mapping[str, Any]) -> bool:
        """True when ``call`` (a tool call dict) names a listed tool with an integer amount above the threshold.

        A malformed amount (text, a float, a boolean) is left to the tools node's validation, which
        refuses it before any SQL; it never reaches a person.
        """
        amount = (call.get("args") or {}).get(self.amount_arg) if isinstance(call.get("args"), Mapping) else None
        return (call.get("name") in self.tools and isinstance(amount, int) and not isinstance(amount, bool)
                and amount > self.threshold_cents)

    def request(self, calls: list[dict], *, thread_id: str, step: int | None, checkpoint_id: str | None = None) -> dict:
        """The approval request shown to a person: one per batch, listing each call (JSON-ready) with
        the hash of its tool and arguments (``args_sha256``, :func:`args_hash`)."""
        return {
            "request_key": request_key(thread_id, self.node, step, checkpoint_id),
            "thread_id": thread_id,
            "threshold_cents": self.threshold_cents,
            "calls": [{"tool_call_id": c["id"], "tool": c["name"], "args": c["args"],
                       "amount_cents": c["args"].get(self.amount_arg), "args_sha256": args_hash(c)} for c in calls],
            "answer_with": {c["id"]: f"{APPROVE} | {REJECT}" for c in calls},
        }

    def as_node(self, pool=None, *, toolset=None, validation: bool = True):
        """The ``approve`` node function. ``pool`` (the business pool) stores requests and decisions;
        None keeps them in the checkpoint only. ``toolset`` (the tools node's
        :class:`agentlab.core.toolspec.Toolset`) with ``validation`` on: a call whose arguments its tool
        refuses is left to the tools node, which answers it ``FAILED [invalid_arguments]`` before any
        SQL; nobody is asked to approve it. Whatever the safeguards, a call holding text the database
        cannot store (a NUL byte: :mod:`agentlab.core.storable`) is answered here with
        ``FAILED [invalid_arguments]`` and never becomes a request (case C21).

        An answer binds to the request it was given for (case C22): a call changed while it waited
        (``aupdate_state`` under the same id) makes a new request, and an answer given before that
        request was shown does not decide it; the thread stops again, on the new request."""

        async def approve(state: dict, config: RunnableConfig, runtime: Runtime) -> dict:
            calls, answered = last_batch(state["messages"])
            candidates = [c for c in calls if c["id"] not in answered and self.needs_approval(c)]
            if toolset is not None and validation:
                candidates = [c for c in candidates if _valid(toolset, c)]
            refused = [c for c in candidates if unstorable_path(c) is not None]
            pending = [c for c in candidates if unstorable_path(c) is None]
            out = [unstorable_message(c) for c in refused]
            if not pending:
                return {"messages": out} if out else {}
            thread_id = str((config.get("configurable") or {}).get("thread_id", "default"))
            step = (config.get("metadata") or {}).get("langgraph_step")
            checkpoint_id = getattr(getattr(runtime, "execution_info", None), "checkpoint_id", None)
            req = self.request(pending, thread_id=thread_id, step=step, checkpoint_id=checkpoint_id)
            shown_at = None
            if pool is not None:  # idempotent: the re-execution on resume writes nothing new
                calls_json = json.dumps(req["calls"], default=str)
                async with pool.connection() as conn:
                    await conn.execute(INSERT_REQUEST, (req["request_key"], thread_id, self.node, step, calls_json))
                    # shown: a pending request of this thread listing exactly these calls (ids, tools, arguments)
                    row = await (await conn.execute(SHOWN_AT, (thread_id, self.node, calls_json))).fetchone()
                    shown_at = row[0] if row else None
            index = 0  # the n-th interrupt() of this node run: LangGraph pairs resume values with them in order
            shown, retry_at = req, None  # after an edit that failed validation: the request with its errors
            while True:
                try:
                    answer = interrupt(shown)
                except GraphInterrupt:
                    if pool is not None:  # the request is what a person sees now, at this interrupt
                        async with pool.connection() as conn:
                            await conn.execute(MARK_SHOWN, (index, req["request_key"]))
                    raise
                if index == retry_at or _answers(answer, req, index, shown_at, bound=pool is not None):
                    read = read_answer(answer, pending, request=req, toolset=toolset)
                    if not read.errors:
                        break
                    shown, retry_at = {**req, "errors": read.errors}, index + 1  # decide nothing, ask again
                index += 1  # an answer to another request (the call changed since), or a failed edit: ask again
            decisions = read.decisions
            if pool is not None:
                async with pool.connection() as conn:
                    await conn.execute(RECORD_DECISIONS, {
                        "decisions": json.dumps({i: d.decision for i, d in decisions.items()}),
                        "details": json.dumps({i: d.record() for i, d in decisions.items()}),
                        "reviewer": read.reviewer, "key": req["request_key"]})
            ai = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
            edited = edited_message(ai, decisions)
            return {"messages": ([edited] if edited is not None else []) + out + [
                rejected_message(c, decisions[c["id"]].message) for c in pending
                if decisions[c["id"]].decision == REJECT],
                "approved": {"message_id": ai.id, "calls": {  # the tools node runs these only as decided
                    i: d.args_sha256 for i, d in decisions.items() if d.decision != REJECT}}}

        return approve

    def route(self, state: dict) -> str:
        """After ``approve``: ``tools`` while a call of the batch has no ToolMessage, else ``agent``."""
        calls, answered = last_batch(state["messages"])
        return "tools" if any(c["id"] not in answered for c in calls) else "agent"


# The approval story: two refunds above the threshold in one batch; the intended end state is the
# demo's decision (reject RMA-3001, approve RMA-3002).
APPROVAL = Scenario(
    name="approval",
    title="Two refunds above the approval threshold wait for a person",
    prompt=("Customer returned two orders: RMA-3001 worth 300.00 and RMA-3002 worth 150.00. Refund both "
            "to their card."),
    customers=(CustomerSpec("acme", "Acme Outfitters", 0),),
    steps=((
        PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-3001", "amount_cents": 30000}),
        PlannedCall("QueueRefund", {"customer_id": C(0), "reference": "RMA-3002", "amount_cents": 15000}),
    ),),
    intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), invoices=(0,),
                      credit_memos=(0,), provider_charges=(0,)),
)


# --------------------------------------------------------------------------- the story, for a notebook

DAY_S = 86400
REFUNDS_PER_REFERENCE = """
SELECT r.reference, (SELECT count(*) FROM provider.payments p WHERE p.reference = o.dedupe_key) AS provider_refunds
FROM refunds r JOIN outbox o ON o.payload->>'refund_id' = r.id::text
WHERE r.customer_id = %s ORDER BY r.reference
"""
THREAD_COUNTS = """
SELECT (SELECT count(*) FROM approval_requests WHERE thread_id = %(thread)s),
       (SELECT count(*) FROM refunds WHERE customer_id = %(customer)s),
       (SELECT count(*) FROM tool_executions WHERE thread_id = %(thread)s),
       (SELECT count(*) FROM outbox WHERE thread_id = %(thread)s AND status = 'dispatched'),
       (SELECT count(*) FROM events WHERE thread_id = %(thread)s AND kind = 'call' AND outcome = 'replayed')
"""
TOOLS_NODE_RUNS = """
SELECT outcome, error_class FROM events WHERE thread_id = %s AND kind = 'node' AND node = 'tools' ORDER BY id
"""


async def resume_days_later(h, *, days: float = 3, seed: int = 0, thread_id: str | None = None) -> dict:
    """The approval story with every delay and crash a real one meets; returns what the database and the
    provider hold at the end.

    1. the thread stops on one approval request for the two refunds of :data:`APPROVAL`;
    2. ``days`` later the reviewer approves both; the tools node commits the refunds with their outbox
       rows, then the process dies before the checkpoint is written (a ``SimulatedCrash`` after COMMIT);
    3. the outbox worker pays the first refund and dies before marking its row;
    4. ``days`` later again (the provider, which keeps keys 24 hours, has forgotten them all) the
       thread is resumed: the tools node runs the batch again and the ledger answers it; the worker
       drains: it finds the paid refund by its reference and pays only the other one.

    ``h`` is a :class:`agentlab.runtime.harness.Harness`; its provider's clock moves forward by ``2 * days``.
    Returns ``requests`` (approval requests stored), ``refund_rows``, ``ledger_rows``,
    ``outbox_dispatched``, ``calls_replayed`` (tool calls the ledger answered on resume),
    ``tools_node_runs`` (the node's outcomes, in order), ``reconciled`` (rows the worker found paid)
    and ``provider_refunds`` (per reference, from the provider's records).
    """
    import uuid

    from langchain_core.messages import HumanMessage

    from agentlab.core.errors import SimulatedCrash
    from agentlab.core.graph import build_graph, run_config
    from agentlab.core.safeguards import preset
    from agentlab.sim.model import ScriptedChatModel

    sg = preset("full")
    ids = await h.create_customers(APPROVAL, sg)
    node = h.node(sg)
    graph = build_graph(ScriptedChatModel(script=APPROVAL.script(ids), seed=seed), node, checkpointer=h.saver,
                        approval=ApprovalPolicy())
    thread_id = thread_id or f"approval-late-{uuid.uuid4().hex[:12]}"
    config = run_config(thread_id, tenant_id=APPROVAL.tenant_id)
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config)

    def die_after_commit(calls):
        node.hooks.after_commit.remove(die_after_commit)  # the restarted process runs normally
        raise SimulatedCrash("the process died after COMMIT, before the checkpoint")

    def worker_dies(row_id):
        raise SimulatedCrash("the worker died after the provider call, before marking the row")

    h.provider.clock.advance(days * DAY_S)
    node.hooks.after_commit.append(die_after_commit)
    try:
        await graph.ainvoke(resume_command(APPROVE), config)
    except SimulatedCrash:
        pass
    h.worker.hooks.after_provider_call.append(worker_dies)
    try:
        await h.worker.run_once()
    except SimulatedCrash:
        pass
    finally:
        h.worker.hooks.after_provider_call.remove(worker_dies)
    h.provider.clock.advance(days * DAY_S)
    await graph.ainvoke(None, config)  # resume from the last checkpoint: the tools node runs again
    drain = await h.worker.drain()
    await h.events.flush()
    async with h.pool.connection() as conn:
        requests, refunds, ledger, dispatched, replayed = await (await conn.execute(
            THREAD_COUNTS, {"thread": thread_id, "customer": ids[0]})).fetchone()
        runs = await (await conn.execute(TOOLS_NODE_RUNS, (thread_id,))).fetchall()
        per_reference = await (await conn.execute(REFUNDS_PER_REFERENCE, (ids[0],))).fetchall()
    return {"requests": requests, "refund_rows": refunds, "ledger_rows": ledger, "outbox_dispatched": dispatched,
            "calls_replayed": replayed, "tools_node_runs": [o if e is None else f"{o} ({e.rsplit('.', 1)[-1]})"
                                                            for o, e in runs],
            "reconciled": drain.reconciled, "provider_refunds": dict(per_reference)}
