"""Checkpoints, replay and forks: a thread's history, what re-executes, and what protects the data.

Every super-step of a thread leaves a checkpoint (langgraph-checkpoint-postgres: ``checkpoints``,
``checkpoint_blobs``, ``checkpoint_writes``). :func:`thread_history` lists them; :func:`replay` runs
the graph again from an earlier one; :func:`fork` writes a changed state on top of an earlier one
(``update_state``) and runs from there. Both leave the later checkpoints in place and add new ones
on a branch of the same thread.

What re-executes: every node after the chosen checkpoint, none before it. The database sees it so:

- a replay from a checkpoint whose next node is ``tools`` re-runs the batch with the *same* tool
  call ids (they are in the checkpointed AIMessage): the ledger (keyed by tenant, thread, tool call
  id and occurrence) returns the stored results, and nothing is written twice;
- a replay from a checkpoint whose next node is ``agent`` calls the model again, which mints *new*
  tool call ids (a real model does; so does the scripted one): the ledger cannot recognise them.
  Only natural keys protect business uniqueness then (one credit memo and one refund per reference,
  one invoice per period); a tool without one (``ApplyCredit``) applies again;
- a fork that edits a tool call's arguments but keeps its id is refused: the ledger keeps each
  call's arguments, and the same id with other arguments gets ``FAILED [conflict]`` (the earlier
  call stands). Give an edited call a new id.

:func:`replay_and_fork_experiment` measures all of it on the refund story, with row counts read from
the database before and after each action.

Sources: LangGraph docs "Persistence" (checkpoints, ``get_state_history``, ``update_state``),
"Time travel" (replay re-executes the nodes after the checkpoint; a fork branches the thread).
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentlab.core.errors import AgentlabError
from agentlab.core.graph import RECURSION_LIMIT

THREAD_COUNTS = """
SELECT
    (SELECT count(*) FROM checkpoints WHERE thread_id = %(thread)s),
    (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(thread)s),
    (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %(thread)s),
    (SELECT count(*) FROM tool_executions WHERE thread_id = %(thread)s),
    (SELECT count(*) FROM outbox WHERE thread_id = %(thread)s),
    (SELECT count(*) FROM credit_memos WHERE customer_id = ANY(%(customers)s)),
    (SELECT count(*) FROM refunds WHERE customer_id = ANY(%(customers)s)),
    (SELECT count(*) FROM invoices WHERE customer_id = ANY(%(customers)s)),
    (SELECT coalesce(sum(credit_cents), 0) FROM customers WHERE id = ANY(%(customers)s)),
    (SELECT count(*) FROM provider.payments WHERE customer = ANY(%(provider_customers)s)),
    (SELECT count(*) FROM events WHERE thread_id = %(thread)s AND kind = 'node')
"""
COUNT_NAMES = ("checkpoints", "checkpoint_writes", "checkpoint_blobs", "ledger_rows", "outbox_rows", "credit_memos",
               "refunds", "invoices", "credit_cents", "provider_payments", "node_executions")


def thread_config(thread_id: str, checkpoint_id: str | None = None, *, tenant_id: str | None = None) -> dict:
    """A run config for ``thread_id``, at ``checkpoint_id`` when given (the kit's recursion limit)."""
    conf: dict[str, Any] = {"thread_id": thread_id, "tenant_id": tenant_id}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf, "recursion_limit": RECURSION_LIMIT}


async def thread_history(graph, thread_id: str, *, tenant_id: str | None = None):
    """A thread's checkpoints, oldest first, as a pandas DataFrame.

    Columns: ``checkpoint_id``, ``parent_id``, ``step`` (the super-step; -1 is the input),
    ``source`` (``input``, ``loop``, ``update``, ``fork``), ``next`` (the nodes that run from it, as
    a tuple), ``messages`` (in the state), ``tool_calls`` (in its last AIMessage, when that is the
    last message), ``interrupts`` (pending), ``created_at``.
    """
    import pandas as pd

    rows = []
    async for snap in graph.aget_state_history(thread_config(thread_id, tenant_id=tenant_id)):
        messages = snap.values.get("messages", []) if isinstance(snap.values, dict) else []
        last = messages[-1] if messages else None
        rows.append({
            "checkpoint_id": snap.config["configurable"]["checkpoint_id"],
            "parent_id": (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
            "step": snap.metadata.get("step") if snap.metadata else None,
            "source": snap.metadata.get("source") if snap.metadata else None,
            "next": tuple(snap.next),
            "messages": len(messages),
            "tool_calls": len(last.tool_calls) if isinstance(last, AIMessage) else 0,
            "interrupts": sum(len(t.interrupts) for t in snap.tasks),
            "created_at": snap.created_at,
        })
    return pd.DataFrame(list(reversed(rows)), columns=["checkpoint_id", "parent_id", "step", "source", "next",
                                                       "messages", "tool_calls", "interrupts", "created_at"])


def find_checkpoint(history, *, next_node: str, occurrence: int = -1) -> str:
    """The id of a checkpoint whose next node is ``next_node`` (``occurrence``: 0 the first, -1 the last).

    Raises:
        LookupError: no checkpoint of the history runs ``next_node`` next.
    """
    matches = history[history["next"].apply(lambda n: next_node in n)]
    if matches.empty:
        raise LookupError(f"no checkpoint runs {next_node!r} next")
    return str(matches.iloc[occurrence]["checkpoint_id"])


async def replay(graph, thread_id: str, checkpoint_id: str, *, tenant_id: str | None = None,
                 durability: str = "sync") -> dict:
    """Run the graph again from ``checkpoint_id``: every node after it re-executes. Returns the final state."""
    config = thread_config(thread_id, checkpoint_id, tenant_id=tenant_id)
    return await graph.ainvoke(None, config, durability=durability)


LEDGER_ROWS_OF_THREAD = "SELECT count(*) FROM tool_executions WHERE thread_id = %s"


class NoCheckpoint(AgentlabError):
    """Raised when a thread to resume has no checkpoint: under ``durability="exit"`` a run that died
    before its end (a kill, a crash) leaves none, whatever its batches committed."""


async def resume_thread(graph, config: dict, *, pool=None, durability: str = "sync") -> dict:
    """Resume a thread from its latest checkpoint (``graph.ainvoke(None, config)``); the final state.

    Where LangGraph would raise ``EmptyInputError`` ("Received no input for __start__") because the
    thread has no checkpoint, this raises :class:`NoCheckpoint` saying what is known: with ``pool``
    (the business pool), how many tool calls of the thread committed (the ledger), and what a
    re-submission of the prompt can and cannot undo (case C23): the model mints new tool call ids,
    so the ledger cannot recognise the committed calls; natural keys refuse a second credit memo,
    refund or invoice for the same reference or period, and the outbox sends a charge once; a tool
    without one (``ApplyCredit``, a bare deduction) applies again unless a refused sibling rolls
    its batch back (the atomic policy).
    """
    snapshot = await graph.aget_state(config)
    if snapshot.values or snapshot.next:
        return await graph.ainvoke(None, config, durability=durability)
    thread_id = (config.get("configurable") or {}).get("thread_id")
    committed = ""
    if pool is not None:
        async with pool.connection() as conn:
            n = (await (await conn.execute(LEDGER_ROWS_OF_THREAD, (thread_id,))).fetchone())[0]
        committed = (f"; {n} of its tool calls committed before that (the ledger holds them)" if n
                     else "; none of its tool calls committed")
    raise NoCheckpoint(
        f"thread {thread_id!r} has no checkpoint to resume (a run under durability='exit' that died before "
        f"its end leaves none){committed}. Re-submit the prompt: natural keys refuse a second credit memo, "
        "refund or invoice, but a call without one (ApplyCredit) can apply again")


async def fork(graph, thread_id: str, checkpoint_id: str, values: dict, *, as_node: str | None = None,
               tenant_id: str | None = None) -> dict:
    """Write ``values`` on top of ``checkpoint_id`` (``update_state``, as if ``as_node`` had returned
    them); return the new checkpoint's config, ready for :func:`run_from`."""
    config = thread_config(thread_id, checkpoint_id, tenant_id=tenant_id)
    new = await graph.aupdate_state(config, values, as_node=as_node)
    new.setdefault("configurable", {})["tenant_id"] = tenant_id
    new["recursion_limit"] = RECURSION_LIMIT
    return new


async def run_from(graph, config: dict, *, durability: str = "sync") -> dict:
    """Run the graph from a checkpoint config (a fork's), to its end or next interrupt."""
    return await graph.ainvoke(None, config, durability=durability)


def edit_tool_call(message: AIMessage, tool: str, new_ids: bool = False, **args: Any) -> AIMessage:
    """A copy of ``message`` (same message id, so ``add_messages`` replaces it) whose calls of ``tool``
    get ``args`` merged in; with ``new_ids`` every call gets a fresh tool call id."""
    calls = []
    for tc in message.tool_calls:
        tc = {**tc, "args": {**tc["args"], **args} if tc["name"] == tool else tc["args"]}
        if new_ids:
            tc["id"] = f"call_fork_{uuid.uuid4().hex[:16]}"
        calls.append(tc)
    return AIMessage(content=message.content, tool_calls=calls, id=message.id,
                     response_metadata=dict(message.response_metadata))


async def thread_counts(pool, thread_id: str, customer_ids: list[int]) -> dict[str, int]:
    """Row counts for one thread and its customers: checkpoints, ledger, outbox, business rows, credit
    (in cents), the provider's payments and the node executions recorded (:data:`COUNT_NAMES`)."""
    from agentlab.sim.provider import customer_ref

    params = {"thread": thread_id, "customers": customer_ids,
              "provider_customers": [customer_ref(c) for c in customer_ids]}
    async with pool.connection() as conn:
        row = await (await conn.execute(THREAD_COUNTS, params)).fetchone()
    return dict(zip(COUNT_NAMES, (int(v) for v in row)))


EXPERIMENT_ACTIONS = (
    ("replay before tools (same ids)", "atomic"),
    ("replay before agent (model re-runs)", "atomic"),
    ("replay before agent (model re-runs)", "partial"),
    ("fork: edit amount, same ids", "atomic"),
    ("fork: edit amount, new ids", "atomic"),
    ("fork: edit amount, new ids", "partial"),
)


async def replay_and_fork_experiment(h, *, seed: int = 0, actions=EXPERIMENT_ACTIONS):
    """Replay and fork the refund story; one row per ``(action, policy)`` with the database's counts.

    Each action runs on a fresh episode of its own (its own customer and thread, played under the
    ``full`` preset with the given batch policy), so the rows do not mix. The actions: replay from
    the last checkpoint before ``tools`` (same tool call ids); replay from the first checkpoint
    before ``agent`` (the model re-runs the whole story and mints new tool call ids); fork
    before the last ``tools`` with the refund amount edited, keeping the ids or with new ones.

    Returns a pandas DataFrame: ``action``, ``policy``, ``thread_id``, ``re_executed`` (node executions),
    ``d_<count>`` for each of :data:`COUNT_NAMES` (after minus before), ``credit_cents_after`` and
    ``escalated`` (the branch ended with the escalation node).
    """
    import pandas as pd

    from agentlab.core.safeguards import preset
    from agentlab.domains.billing.scenarios import get_scenario
    from agentlab.sim.model import ScriptedChatModel

    scenario = get_scenario("refund")
    rows = []
    for action, policy in actions:
        sg = preset("full").replace(policy=policy, name=f"full-{policy}")
        ids = await h.create_customers(scenario, sg)
        model = ScriptedChatModel(script=scenario.script(ids), seed=seed)
        graph = h.graph(sg, model)
        thread = f"history-{uuid.uuid4().hex[:10]}"
        await _play(h, graph, scenario, thread)
        await h.worker.drain()
        history = await thread_history(graph, thread, tenant_id=scenario.tenant_id)
        before = await thread_counts(h.pool, thread, ids)
        if action.startswith("replay before tools"):
            state = await replay(graph, thread, find_checkpoint(history, next_node="tools"),
                                 tenant_id=scenario.tenant_id)
        elif action.startswith("replay before agent"):
            state = await replay(graph, thread, find_checkpoint(history, next_node="agent", occurrence=0),
                                 tenant_id=scenario.tenant_id)
        else:
            cp = find_checkpoint(history, next_node="tools")
            snap = await graph.aget_state(thread_config(thread, cp, tenant_id=scenario.tenant_id))
            edited = edit_tool_call(snap.values["messages"][-1], "QueueRefund", new_ids=action.endswith("new ids"),
                                    amount_cents=2000)
            config = await fork(graph, thread, cp, {"messages": [edited]}, as_node="agent",
                                tenant_id=scenario.tenant_id)
            state = await run_from(graph, config)
        await h.worker.drain()
        await h.events.flush()
        after = await thread_counts(h.pool, thread, ids)
        row = {"action": action, "policy": policy, "thread_id": thread,
               "re_executed": after["node_executions"] - before["node_executions"]}
        row.update({f"d_{k}": after[k] - before[k] for k in COUNT_NAMES if k != "node_executions"})
        row["credit_cents_after"] = after["credit_cents"]
        row["escalated"] = bool(state.get("escalated", False))
        rows.append(row)
    return pd.DataFrame(rows)


async def _play(h, graph, scenario, thread: str) -> None:
    """Play ``scenario`` to its end on ``thread`` with every checkpoint written (durability ``sync``)."""
    await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]},
                        thread_config(thread, tenant_id=scenario.tenant_id), durability="sync")
    await h.events.flush()


def tool_messages(state: dict) -> list[ToolMessage]:
    """The ToolMessages of a state, in order."""
    return [m for m in state.get("messages", []) if isinstance(m, ToolMessage)]
