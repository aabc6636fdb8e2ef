"""A run's OpenTelemetry trace, read back in a notebook: its spans as a DataFrame and as a waterfall.

:func:`traced_episode` plays an episode with tracing on (:mod:`agentlab.core.tracing`) into the SDK's own
``InMemorySpanExporter`` and returns its finished spans; :func:`span_frame` turns them into one row per span,
parents before their children; :func:`trace_waterfall` draws that frame as a waterfall: one bar per span, from
its start, as long as it lasted, coloured by what became of the tool call.

A collector (Jaeger, Phoenix, Langfuse, ...) draws the same waterfall from the same spans when
``OTEL_TRACES_EXPORTER=otlp`` points the kit at it.

Source: OpenTelemetry Python SDK ``InMemorySpanExporter``.
"""

from __future__ import annotations

from typing import Any

SPAN_FRAME_COLUMNS = ("span", "parent", "depth", "start_ms", "duration_ms", "tool_call_id", "outcome", "category",
                      "sqlstate", "savepoint", "attempt", "input_tokens", "output_tokens")
OUTCOME_COLORS = {"applied": "tab:green", "replayed": "tab:blue", "failed": "tab:red", "not_applied": "tab:gray",
                  None: "tab:purple"}  # None: the run and its model calls


async def traced_episode(h, scenario: str = "refund", safeguards: str = "full", **kwargs) -> tuple[Any, list]:
    """Play ``scenario`` under ``safeguards`` on the harness ``h`` (keyword arguments as
    :meth:`agentlab.runtime.harness.Harness.run_episode` takes them) with its graph traced into memory.

    Returns ``(episode, spans)``: the :class:`agentlab.runtime.harness.Episode` and its finished spans (the SDK's
    ``ReadableSpan``), in the order they ended.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentlab.core.tracing import tracing_to

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing_to(provider):
        episode = await h.run_episode(scenario, safeguards, **kwargs)
    return episode, list(exporter.get_finished_spans())


def span_frame(spans: list):
    """``spans`` as a pandas DataFrame, one row per span (columns :data:`SPAN_FRAME_COLUMNS`), each span after its
    parent and its earlier siblings; times in milliseconds since the first span started; ``parent`` is the
    parent's name, ``depth`` its distance from the root."""
    import pandas as pd

    by_id = {s.context.span_id: s for s in spans}
    children: dict[Any, list] = {}
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in by_id else None
        children.setdefault(parent, []).append(s)
    t0 = min((s.start_time for s in spans), default=0)
    rows: list[dict] = []

    def visit(parent_id, depth: int) -> None:
        for s in sorted(children.get(parent_id, []), key=lambda s: (s.start_time, s.end_time)):
            a = s.attributes or {}
            rows.append({
                "span": s.name, "parent": by_id[parent_id].name if parent_id is not None else None, "depth": depth,
                "start_ms": (s.start_time - t0) / 1e6, "duration_ms": (s.end_time - s.start_time) / 1e6,
                "tool_call_id": a.get("gen_ai.tool.call.id"), "outcome": a.get("agentlab.outcome"),
                "category": a.get("agentlab.category"), "sqlstate": a.get("db.response.status_code"),
                "savepoint": a.get("agentlab.savepoint"), "attempt": a.get("agentlab.attempt"),
                "input_tokens": a.get("gen_ai.usage.input_tokens"), "output_tokens": a.get("gen_ai.usage.output_tokens"),
            })
            visit(s.context.span_id, depth + 1)

    visit(None, 0)
    frame = pd.DataFrame(rows, columns=list(SPAN_FRAME_COLUMNS))
    for column in ("attempt", "input_tokens", "output_tokens"):
        frame[column] = frame[column].astype("Int64")
    return frame


def trace_waterfall(frame, *, ax=None, title: str | None = None):
    """A waterfall of a trace (:func:`span_frame`); returns the matplotlib Figure.

    One bar per span, top to bottom in the frame's order and indented by depth in its label: from its start, as
    long as it lasted (a call that never ran is a thin mark at the moment its batch was answered). A tool call's
    colour is its outcome (applied green, replayed blue, failed red, not applied grey), the run's and the model
    calls' purple."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.32 * max(1, len(frame))))
    else:
        fig = ax.figure
    if frame.empty:
        ax.set_title(title or "no spans recorded")
        return fig
    outcomes = [o if isinstance(o, str) else None for o in frame["outcome"]]
    for y, (row, outcome) in enumerate(zip(frame.itertuples(), outcomes)):
        ax.barh(y, max(row.duration_ms, 0.15), left=row.start_ms, height=0.6, color=OUTCOME_COLORS[outcome],
                edgecolor="black", linewidth=0.3)
    labels = ["  " * d + s for d, s in zip(frame["depth"], frame["span"])]
    ax.set_yticks(range(len(frame)), labels, fontsize=8)
    ax.set_ylim(len(frame) - 0.4, -0.6)
    ax.set_xlabel("time since the run started (ms)")
    ax.set_title(title or f"one run's trace: {len(frame)} spans")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in OUTCOME_COLORS.values()]
    ax.legend(handles, [o or "run / model call" for o in OUTCOME_COLORS], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=7, title="tool call", title_fontsize=7)
    fig.tight_layout()
    return fig
