"""The agent graph: agent -> tools -> agent ..., with capped retries and escalation.

- ``agent`` calls the model. Before it does, any tool call id left without a ToolMessage (a crash,
  an older version: case C02) is answered: with the ledger's stored result when the call committed,
  else ``NOT APPLIED``, so the model never receives an unanswered call. What it is sent then keeps the
  rules real providers enforce (:mod:`agentlab.core.provider_rules`: each call answered once, right
  after its AIMessage, no answer without a call), and a streamed call's cut-off arguments stay invalid
  (:mod:`agentlab.core.streamed_calls`). A reply the model's client cannot turn into an AIMessage is
  asked for again, then ends the turn with one ``MODEL ERROR`` AIMessage naming its shape; it never
  enters the history (:mod:`agentlab.core.model_replies`, case C47).
- ``tools`` is :class:`agentlab.core.batch.TransactionalToolsNode`, under a RetryPolicy that retries
  infrastructure errors only (:func:`agentlab.core.errors.is_infrastructure`). LangGraph's default
  ``retry_on`` retries every exception that is not a Python built-in error, psycopg's constraint
  violations included; re-running a constraint violation cannot fix it, so the kit does not rely on it.
- after ``max_rollbacks`` consecutive rolled-back batches the run goes to ``escalate``: the state is
  marked escalated, an event is recorded, and the run ends for a person to take over.
- an explicit ``recursion_limit`` (:data:`RECURSION_LIMIT`) caps any loop.
- with an approval policy (:class:`agentlab.durable.approval.ApprovalPolicy`) an ``approve`` node sits between
  ``agent`` and ``tools``: calls the policy names wait for a person (``interrupt()``); rejected calls
  are answered there and ``tools`` runs the rest.
- every node is wrapped by :func:`agentlab.lab.observability.observe_node`: one event per node execution.
- with OpenTelemetry on (``OTEL_TRACES_EXPORTER``, or :func:`agentlab.core.tracing.enable`) each run is an
  ``invoke_agent`` span with its ``chat`` and ``execute_tool`` spans (:mod:`agentlab.core.tracing`).
- under ``run_lock`` the compiled graph is a :class:`agentlab.core.leased_graph.LeasedGraph`: every run
  holds its thread's lease, whoever calls the graph (``ainvoke``, ``astream``, a ``Command`` resume; C41).

Sources: LangGraph docs "Graph API: RetryPolicy", "Persistence", "add_messages".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.types import RetryPolicy

from agentlab.core.batch import LEDGER_LOOKUP, TransactionalToolsNode, idempotency_key
from agentlab.core.errors import Category, is_infrastructure
from agentlab.core.events import observe_node
from agentlab.core.leased_graph import LeasedGraph, RunLeases
from agentlab.core.messages import (
    FAILED_PREFIX,
    FAILED_TEMPLATE,
    INVALID_JSON_ARGUMENTS,
    NOT_APPLIED_TEMPLATE,
    ORPHANED_CALL,
    all_tool_calls,
    batches,
    occurrences,
    unanswered_tool_calls,
    with_call_ids,
)
from agentlab.core.model_replies import REPLY_ATTEMPTS, read_reply
from agentlab.core.provider_rules import check_history, provider_view
from agentlab.core.streamed_calls import StrictStreamedArguments
from agentlab.core.toolspec import result_content
from agentlab.core.tracing import traced

RECURSION_LIMIT = 60
RETRY_ATTEMPTS = 3
MAX_REPEATED_REFUSALS = 3  # the same refused call (tool and arguments) this often in one run: escalate (C24)
# FAILED categories that say "this call, as sent, will not work"; timeout and transient invite a resend
REFUSAL_CATEGORIES = frozenset(c.value for c in Category) - {Category.TIMEOUT.value, Category.TRANSIENT.value,
                                                              Category.NOT_APPLIED.value}


class AgentState(TypedDict, total=False):
    """The graph's state. ``rollbacks`` counts consecutive rolled-back batches, ``rollbacks_total`` all;
    ``model_error`` is set when the last turn ended because no reply of the model could be read (C47).
    ``approved`` is what the ``approve`` node decided for the last AIMessage: ``{"message_id": id, "calls":
    {tool_call_id: args_sha256}}`` for the calls approved or edited; the tools node runs such a call only
    while its name and arguments still hash to it (:mod:`agentlab.durable.approval`)."""

    messages: Annotated[list[AnyMessage], add_messages]
    rollbacks: int
    rollbacks_total: int
    escalated: bool
    escalation_reason: str | None
    model_error: str | None
    approved: dict | None


def retry_policy(max_attempts: int = RETRY_ATTEMPTS) -> RetryPolicy:
    """The tools node's RetryPolicy: infrastructure errors only, short capped backoff, no jitter."""
    return RetryPolicy(initial_interval=0.05, backoff_factor=2.0, max_interval=1.0, max_attempts=max_attempts,
                       jitter=False, retry_on=is_infrastructure)


async def repair_orphans(messages: list[AnyMessage], pool, thread_id: str,
                         tenant_id: str | None = None) -> list[AnyMessage] | None:
    """Answer every unanswered tool call right after its AIMessage; None when there is none.

    A call found in the ledger (under the key the tools node used: tenant, thread, id, occurrence) is
    answered with its stored result (it committed before the crash); a call whose arguments were not
    valid JSON with ``FAILED [invalid_arguments]`` (it never ran); any other with ``NOT APPLIED``
    (:data:`agentlab.core.messages.ORPHANED_CALL`). A call without an id (case C15) first gets its
    stable synthetic id (:func:`agentlab.core.messages.with_call_ids`), so the answer has a string id.
    """
    fixed = [with_call_ids(m) or m if isinstance(m, AIMessage) else m for m in messages]
    if not unanswered_tool_calls(fixed):
        return None
    wanted: list[tuple[int, dict, str]] = []  # (AIMessage position, call, ledger key)
    for at, m, replies in batches(fixed):
        occ = occurrences(fixed, at)
        for tc in m.tool_calls:
            if tc["id"] not in replies:
                wanted.append((at, tc, idempotency_key(thread_id, tc["id"], tenant_id=tenant_id,
                                                       occurrence=occ.get(tc["id"], 0))))
    stored: dict[str, Any] = {}
    if pool is not None and wanted:
        async with pool.connection() as conn:
            cur = await conn.execute(LEDGER_LOOKUP, ([k for _, _, k in wanted],))
            stored = {k: v for k, v in await cur.fetchall()}
    keys = {(at, tc["id"]): k for at, tc, k in wanted}
    repaired: list[AnyMessage] = []
    segments = {at: replies for at, _, replies in batches(fixed)}
    for i, m in enumerate(fixed):
        repaired.append(m)
        if not isinstance(m, AIMessage):
            continue
        for tc in m.tool_calls:
            if tc["id"] in segments[i]:
                continue
            key = keys[(i, tc["id"])]
            if key in stored:
                repaired.append(ToolMessage(result_content(stored[key]), tool_call_id=tc["id"], name=tc["name"],
                                            artifact={"outcome": "replayed", "category": None}))
            else:
                repaired.append(ToolMessage(NOT_APPLIED_TEMPLATE.format(reason=ORPHANED_CALL), tool_call_id=tc["id"],
                                            name=tc["name"], status="error",
                                            artifact={"outcome": "not_applied", "category": "not_applied"}))
        for tc in m.invalid_tool_calls:
            if tc["id"] in segments[i]:
                continue
            repaired.append(ToolMessage(
                FAILED_TEMPLATE.format(category=Category.INVALID_ARGUMENTS.value, reason=INVALID_JSON_ARGUMENTS),
                tool_call_id=tc["id"], name=str(tc.get("name")), status="error",
                artifact={"outcome": "failed", "category": Category.INVALID_ARGUMENTS.value}))
    return repaired


def repeated_refusal(messages: list[AnyMessage]) -> tuple[str, int] | None:
    """The refused call sent most often in the current run, as ``(tool name, times)``; None when no call
    was refused.

    A run is what follows the last HumanMessage. A call counts when its answer reads ``FAILED [...]``
    with a category of :data:`REFUSAL_CATEGORIES` (not a raw error, which the naive presets return);
    two calls are the same when tool and arguments are equal, whatever ids they had and whatever
    calls came between (case C24)."""
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1) + 1
    counts: dict[str, tuple[str, int]] = {}
    for _, m, replies in batches(messages[start:]):
        for tc in all_tool_calls(m):
            reply = replies.get(tc.get("id") or "")
            artifact = getattr(reply, "artifact", None) or {}
            if (artifact.get("outcome") != "failed" or artifact.get("category") not in REFUSAL_CATEGORIES
                    or not str(reply.content).startswith(FAILED_PREFIX)):
                continue  # only a call the model was told plainly was refused (a raw error tells it nothing)
            args = tc.get("args")
            sig = json.dumps([tc.get("name"), args], sort_keys=True, default=str)
            counts[sig] = (str(tc.get("name")), counts.get(sig, ("", 0))[1] + 1)
    best = max(counts.values(), key=lambda v: v[1], default=None)
    return best


def agent_node(bound, node: TransactionalToolsNode, *, reply_attempts: int) -> Callable:
    """The ``agent`` node: repairs orphaned calls, holds the history to the providers' rules, asks ``bound``
    (the model with its tools bound) for the next reply (:func:`agentlab.core.model_replies.read_reply`) and
    gives its tool calls stable ids."""
    events = node.events

    async def agent(state: AgentState, config: RunnableConfig) -> dict:
        conf = config.get("configurable", {})
        thread_id = str(conf.get("thread_id", "default"))
        messages = state["messages"]
        tenant_id = await node.thread_tenant(thread_id, conf.get("tenant_id")) if unanswered_tool_calls(messages) else None
        repaired = await repair_orphans(messages, kit_pool(node), thread_id, tenant_id)
        if repaired is not None:
            events.record("agent", "orphans_answered", thread_id=thread_id,
                          detail=f"{len(unanswered_tool_calls(messages))} unanswered tool call(s) answered")
        history = repaired if repaired is not None else messages
        sent = provider_view(history)  # the rules providers enforce; the same list when it keeps them
        if sent is not history:
            check_history(sent)
        reply = await read_reply(lambda messages: call_model(messages, config), sent, attempts=reply_attempts)
        for n, failure in enumerate(reply.failures, 1):
            events.record("agent", "reply_unreadable", thread_id=thread_id, attempt=n,
                          detail=f"{failure.error}: {failure.shape}")
        response = reply.message
        if all_tool_calls(response):
            if not response.id:
                response.id = f"lc_{uuid.uuid4()}"
            response = with_call_ids(response) or response  # ids the model left out (C15), stable from now on
        update: dict[str, Any] = {}
        if reply.error is not None or state.get("model_error"):
            update["model_error"] = reply.error  # set by a turn that ended on one, cleared by the next that reads
        if repaired is not None:
            return {**update, "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *repaired, response]}
        return {**update, "messages": [response]}

    async def call_model(messages: list[AnyMessage], config: RunnableConfig):
        strict = StrictStreamedArguments()  # a streamed call's cut-off arguments stay invalid (not completed)
        return strict.correct(await bound.ainvoke(messages, merge_configs(config, {"callbacks": [strict]})))

    return agent


def kit_pool(node: TransactionalToolsNode):
    """The pool of the kit's own bookkeeping around ``node`` (the run's thread lease, approval requests, the
    orphan repair's ledger look-up): the node's ``kit_pool`` when it has one, else its pool. A node whose
    pool logs in as the agent role (an isolating preset, case C45) must not keep them there: the role may
    not touch leases or approvals, and must not, or a tool could approve its own calls.
    ``Harness.node`` and the lab's processes set ``kit_pool`` to their business pool."""
    return getattr(node, "kit_pool", None) or node.pool


def build_graph(model, node: TransactionalToolsNode, *, checkpointer=None, max_rollbacks: int | None = None,
                retry_attempts: int = RETRY_ATTEMPTS, approval=None, max_refusals: int = MAX_REPEATED_REFUSALS,
                reply_attempts: int = REPLY_ATTEMPTS, pool=None):
    """Compile the agent graph.

    Args:
        model: a chat model with ``bind_tools`` (the scripted one or a real one).
        node: the transactional tools node; its pool also serves the orphan repair's ledger look-up.
        checkpointer: a LangGraph checkpointer (``AsyncPostgresSaver`` in the kit), or None.
        max_rollbacks: consecutive rolled-back batches before escalation (default: the node's safeguards).
        retry_attempts: the tools node's RetryPolicy attempts (the node answers on the last one).
        approval: an :class:`agentlab.durable.approval.ApprovalPolicy`; adds the ``approve`` node (needs a checkpointer).
        max_refusals: how often the same refused call (same tool, same arguments) may come back in one run
            before escalation, whatever lies between (see :func:`repeated_refusal`).
        reply_attempts: model calls per turn while the model's replies cannot be read (a retry is told
            what was wrong); then the turn ends with one ``MODEL ERROR`` AIMessage
            (:func:`agentlab.core.model_replies.read_reply`, case C47).
        pool: the pool of the kit's bookkeeping (default :func:`kit_pool`): the lease, approval requests.

    Returns:
        the compiled graph; under ``node.safeguards.run_lock`` a :class:`agentlab.core.leased_graph.LeasedGraph`
        on that pool, whose runs are refused (``ThreadBusy``) while another run holds the thread.
    """
    bound = model.bind_tools(node.toolset.schemas())
    kit = pool or kit_pool(node)
    limit = max_rollbacks or node.safeguards.max_rollbacks
    node.max_attempts = retry_attempts
    events = node.events

    async def escalate(state: AgentState, config: RunnableConfig) -> dict:
        thread_id = str(config.get("configurable", {}).get("thread_id", "default"))
        repeated = repeated_refusal(state["messages"])
        if state.get("rollbacks", 0) >= limit or repeated is None or repeated[1] < max_refusals:
            reason = f"{state.get('rollbacks', 0)} consecutive batches were rolled back"
        else:
            reason = f"the same refused {repeated[0]} call came back {repeated[1]} times in this run"
        events.record("escalate", "escalated", thread_id=thread_id, detail=reason)
        await events.flush()
        return {"escalated": True, "escalation_reason": reason}

    async def after_agent(state: AgentState) -> str:  # async: a sync router runs in a thread pool
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and all_tool_calls(last):
            return "tools" if approval is None else "approve"
        return END

    async def after_tools(state: AgentState) -> str:
        if state.get("rollbacks", 0) >= limit:
            return "escalate"
        repeated = repeated_refusal(state["messages"])
        return "escalate" if repeated is not None and repeated[1] >= max_refusals else "agent"

    graph = StateGraph(AgentState)
    graph.add_node("agent", observe_node("agent", agent_node(bound, node, reply_attempts=reply_attempts), events))
    graph.add_node("tools", observe_node("tools", node.as_node(), events), retry_policy=retry_policy(retry_attempts))
    graph.add_node("escalate", observe_node("escalate", escalate, events))
    graph.add_edge(START, "agent")
    if approval is not None:
        graph.add_node("approve", observe_node("approve", approval.as_node(kit, toolset=node.toolset, validation=node.safeguards.validation), events))
        graph.add_conditional_edges("agent", after_agent, ["approve", END])
        graph.add_conditional_edges("approve", approval.route, ["tools", "agent"])
    else:
        graph.add_conditional_edges("agent", after_agent, ["tools", END])
    graph.add_conditional_edges("tools", after_tools, ["agent", "escalate"])
    graph.add_edge("escalate", END)
    compiled = traced(graph.compile(checkpointer=checkpointer), node.safeguards.name)  # OpenTelemetry, when on
    if not node.safeguards.run_lock or kit is None:
        return compiled
    return LeasedGraph.of(compiled, RunLeases(kit, wait_ms=node.safeguards.run_lock_wait_ms))


def run_config(thread_id: str, *, tenant_id: str | None = None, recursion_limit: int = RECURSION_LIMIT,
               run_id: str | None = None) -> dict:
    """The RunnableConfig of one run: thread, tenant (never from the model) and the recursion limit; with
    ``run_id``, the run that per-run tool-call budgets count under (:mod:`agentlab.core.batch.budgets`)."""
    conf = {"thread_id": thread_id, "tenant_id": tenant_id} | ({"run_id": run_id} if run_id is not None else {})
    return {"configurable": conf, "recursion_limit": recursion_limit}


