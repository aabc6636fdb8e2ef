"""Observability: one structured event per node execution, a run's events as a DataFrame, a timeline.

:func:`observe_node` wraps a LangGraph node function. Every execution of the node (each retry
attempt, and each re-execution on resume) leaves exactly one event of kind ``node`` with the thread,
the node, the attempt (``runtime.execution_info.node_attempt``), the super-step (``langgraph_step``
from the config's metadata), the start time, the latency in milliseconds, the outcome (``ok``,
``error`` or ``interrupted``), the error class and, where the model reports them
(``AIMessage.usage_metadata``), input and output token counts. The event goes to the
``agentlab.core.events`` logger at once and to the ``events`` table with the next flush.

An interrupt is not an error: ``interrupt()`` raises ``GraphInterrupt`` (a ``GraphBubbleUp``), which
the wrapper records as ``interrupted`` and re-raises unchanged, so LangGraph sees exactly what the
node raised. Any other exception is recorded as ``error`` and re-raised unchanged too, so the
graph's RetryPolicy decides as before.

The tools node keeps its own events of kind ``call`` (one per tool call) and ``note``; node
executions are counted from ``node`` events only (see :mod:`agentlab.core.events`), so nothing is
counted twice.

Sources: LangGraph docs "Interrupts" (a node re-executes from its start on resume), "Graph API:
RetryPolicy", "Runtime" (``execution_info``); LangChain ``UsageMetadata``.
"""

from __future__ import annotations

from agentlab.core.events import ERROR, INTERRUPTED, OK

RUN_EVENTS = """
SELECT id, kind, node, outcome, step, attempt, started_at, latency_ms, input_tokens, output_tokens,
       tool_name, tool_call_id, category, sqlstate, error_class, detail, created_at
FROM events WHERE thread_id = %s AND (%s::text IS NULL OR kind = %s) ORDER BY id
"""
EVENT_FRAME_COLUMNS = (
    "id", "kind", "node", "outcome", "step", "attempt", "started_at", "latency_ms", "input_tokens",
    "output_tokens", "tool_name", "tool_call_id", "category", "sqlstate", "error_class", "detail", "created_at",
)
OUTCOME_COLORS = {OK: "tab:green", ERROR: "tab:red", INTERRUPTED: "tab:orange"}


# --------------------------------------------------------------------------- reading a run back


async def run_events(source, thread_id: str, *, kind: str | None = None):
    """A thread's events as a pandas DataFrame, oldest first (columns :data:`EVENT_FRAME_COLUMNS`).

    Args:
        source: a :class:`agentlab.runtime.harness.Harness` (its buffered events are flushed first) or a pool.
        thread_id: the run's thread.
        kind: ``"node"``, ``"call"`` or ``"note"`` to keep one kind; None for all.
    """
    import pandas as pd

    pool = getattr(source, "pool", source)
    events = getattr(source, "events", None)
    if events is not None:
        await events.flush()
    async with pool.connection() as conn:
        rows = await (await conn.execute(RUN_EVENTS, (thread_id, kind, kind))).fetchall()
    frame = pd.DataFrame(rows, columns=list(EVENT_FRAME_COLUMNS))
    for column in ("step", "attempt", "input_tokens", "output_tokens"):
        frame[column] = frame[column].astype("Int64")
    frame["latency_ms"] = frame["latency_ms"].astype("float64")
    return frame


def node_summary(frame):
    """Per node: executions, errors, interrupts, total and mean latency (ms), tokens in and out."""
    import pandas as pd

    nodes = frame[frame["kind"] == "node"]
    if nodes.empty:
        return pd.DataFrame(columns=["executions", "errors", "interrupts", "latency_ms_total", "latency_ms_mean",
                                     "input_tokens", "output_tokens"])
    grouped = nodes.groupby("node", sort=False)
    return pd.DataFrame({
        "executions": grouped.size(),
        "errors": grouped["outcome"].apply(lambda s: int((s == ERROR).sum())),
        "interrupts": grouped["outcome"].apply(lambda s: int((s == INTERRUPTED).sum())),
        "latency_ms_total": grouped["latency_ms"].sum().round(3),
        "latency_ms_mean": grouped["latency_ms"].mean().round(3),
        "input_tokens": grouped["input_tokens"].sum(min_count=1),
        "output_tokens": grouped["output_tokens"].sum(min_count=1),
    })


def timeline_chart(frame, *, ax=None, title: str | None = None):
    """A Gantt-style timeline of a run's node executions; returns the matplotlib Figure.

    One bar per ``node`` event: it starts at the node's start time and is as long as its latency,
    both in milliseconds since the first node of the run started; the colour is the outcome (green
    ok, red error, orange interrupted); the label is the attempt and, for model calls, the tokens.
    A long pause (a run waiting days for approval) shows as a gap; it is drawn to scale.
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    nodes = frame[frame["kind"] == "node"].copy()
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 1.4 + 0.45 * max(1, nodes["node"].nunique())))
    else:
        fig = ax.figure
    if nodes.empty:
        ax.set_title(title or "no node executions recorded")
        return fig
    t0 = nodes["started_at"].min()
    nodes["start_ms"] = (nodes["started_at"] - t0).dt.total_seconds() * 1000
    lanes = list(dict.fromkeys(nodes["node"]))
    labelled = {lane: 0 for lane in lanes}
    for _, row in nodes.iterrows():
        y = lanes.index(row["node"])
        width = max(float(row["latency_ms"] or 0.0), 0.05)
        ax.barh(y, width, left=row["start_ms"], height=0.5, color=OUTCOME_COLORS.get(row["outcome"], "tab:gray"),
                edgecolor="black", linewidth=0.4)
        label = f"a{row['attempt']}"
        if pd.notna(row["input_tokens"]):
            label += f" {int(row['input_tokens'])}/{int(row['output_tokens'])} tok"
        # labels of a lane alternate below and above its bars, so that bars close in time stay readable
        below = labelled[row["node"]] % 2 == 0
        labelled[row["node"]] += 1
        ax.text(row["start_ms"], y + 0.28 if below else y - 0.28, label, fontsize=7, va="top" if below else "bottom")
    ax.margins(x=0.12)  # room for the last bar's label
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.4, -0.6)  # top to bottom in order of first execution, room for the labels
    ax.set_xlabel("time since the run's first node started (ms)")
    ax.set_ylabel("node")
    ax.set_title(title or f"node executions of one run ({len(nodes)} in {nodes['step'].nunique()} super-steps)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in OUTCOME_COLORS.values()]
    ax.legend(handles, list(OUTCOME_COLORS), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              title="outcome", title_fontsize=7)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- a run with a hidden retry


async def episode_with_a_retry(h, scenario: str = "refund", *, thread_id: str | None = None, seed: int = 0):
    """Play ``scenario`` under ``full`` while another session holds the customer's row (``SELECT ... FOR
    UPDATE`` on a second connection: :class:`agentlab.lab.row_lock.RowLock`) during the tools node's first
    attempt at SQL: the first write waits past ``lock_timeout`` (SQLSTATE 55P03, an infrastructure
    error), the graph's RetryPolicy runs the node again, and the other session lets go as that second
    attempt starts.

    The final state is the same as a clean run's; only the events tell the retry. ``h`` is a
    :class:`agentlab.runtime.harness.Harness`; returns the :class:`agentlab.runtime.harness.Episode` (outbox drained,
    events flushed).
    """
    import uuid

    from langchain_core.messages import HumanMessage

    from agentlab.core.graph import build_graph, run_config
    from agentlab.core.safeguards import preset
    from agentlab.lab.row_lock import RowLock
    from agentlab.runtime.harness import Episode
    from agentlab.sim.model import ScriptedChatModel

    sc, sg = h.scenario(scenario), preset("full")
    ids = await h.create_customers(sc, sg)
    node = h.node(sg)
    lock = await RowLock.acquire(h.url, ids[0])
    first_calls: list[int] = []

    async def let_go_when_the_retry_starts(call, index):
        if index == 0:
            first_calls.append(index)
            if len(first_calls) == 2:
                await lock.release()

    node.hooks.before_call.append(let_go_when_the_retry_starts)
    graph = build_graph(ScriptedChatModel(script=sc.script(ids), seed=seed), node, checkpointer=h.saver)
    thread_id = thread_id or f"{sc.name}-{uuid.uuid4().hex[:12]}"
    try:
        state = await graph.ainvoke({"messages": [HumanMessage(sc.prompt)]},
                                    run_config(thread_id, tenant_id=sc.tenant_id))
    finally:
        await lock.release()
    ep = Episode(sc.name, sg.name, thread_id, seed, ids, sg.schema, sc.tenant_id, messages=list(state["messages"]),
                 rollbacks_total=state.get("rollbacks_total", 0), escalated=bool(state.get("escalated", False)))
    ep.drain = await h.worker.drain()
    await h.events.flush()
    return ep
