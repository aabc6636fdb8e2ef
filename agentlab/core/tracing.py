"""OpenTelemetry traces of the agent's runs, after the GenAI semantic conventions: off by default, free when off.

The spans of one graph run::

    invoke_agent agentlab          a run (``ainvoke``, ``astream``, a resume): gen_ai.conversation.id (the thread)
      chat <model>                 each model call: gen_ai.provider.name, gen_ai.request.model, gen_ai.usage.*
      execute_tool <tool>          each tool call the tools node answered: gen_ai.tool.name, gen_ai.tool.call.id,
                                   and the kit's own attributes (:data:`OUTCOME` ... below)

An ``execute_tool`` span says what became of the call, not only that a tool ran: ``agentlab.outcome``
(``applied``, ``failed``, ``not_applied``, ``replayed``: as stored, known once COMMIT returned, so the spans
of a batch are written when it has been answered, with each call's own start time and duration),
``agentlab.category``, ``db.response.status_code`` (the SQLSTATE of a failed call; ``error.type`` too),
``agentlab.savepoint`` (the savepoint a call that ran was held in), ``agentlab.attempt`` (the tools node's
attempt under the RetryPolicy) and the batch's size and end. Round trips are not counted: psycopg does not
count them, and counting them would cost what tracing off must not (``python -m agentlab bench`` measures
them).

**Turning it on**, the standard way: ``OTEL_TRACES_EXPORTER`` (``console``, ``otlp`` with
``OTEL_EXPORTER_OTLP_ENDPOINT``, ...) in the environment before the graph is built. The kit then configures
the SDK from the ``OTEL_*`` variables with the SDK's own autoconfiguration (what ``opentelemetry-instrument``
runs), unless the process already has an SDK tracer provider, which it uses. ``OTEL_SDK_DISABLED=true``
wins. Or in code: :func:`enable` with a ``TracerProvider`` of yours (the tests use the SDK's
``InMemorySpanExporter``), :func:`disable` to stop. Either way the switch is read when a graph is built: a graph
built traced stays traced, one built untraced stays free.

**Off** (the default) nothing of OpenTelemetry is imported, the graph gets no callback and the tools node's
one call here returns at once. **Never in the way**: an exporter that fails (an endpoint that does not
answer) costs one warning, and the run goes on; a span is exported after the fact, in the background, and
may be lost. The events table (:mod:`agentlab.core.events`) stays the durable record: every call has its
event, and an applied call's is rebuilt from the ledger when it was lost (case C38).

Sources: OpenTelemetry semantic conventions "Generative AI: agent spans", "execute_tool", "model spans";
"Database: PostgreSQL" (``db.response.status_code`` is the SQLSTATE); OpenTelemetry Python SDK
"Environment variables"; LangChain "Callbacks".
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

TRACER_NAME = "agentlab"
AGENT_NAME = "agentlab"
OUTCOME, CATEGORY, SAVEPOINT, ATTEMPT = "agentlab.outcome", "agentlab.category", "agentlab.savepoint", "agentlab.attempt"
BATCH_CALLS, BATCH_ROLLED_BACK, PRESET = "agentlab.batch.calls", "agentlab.batch.rolled_back", "agentlab.preset"
SQLSTATE = "db.response.status_code"
TRACES_OFF = ("OpenTelemetry traces are off: {error} (OTEL_TRACES_EXPORTER={exporters}; the exporter's package must be "
              "installed, e.g. opentelemetry-exporter-otlp-proto-http for otlp); the run goes on without them")

_UNDECIDED = object()  # the environment is read when the first graph is built
_tracer: Any = _UNDECIDED  # None: tracing is off (the default); else an OpenTelemetry Tracer


def enable(provider: Any = None) -> None:
    """Trace the graphs built from now on with ``provider`` (an OpenTelemetry ``TracerProvider``; None: the
    process's global one)."""
    global _tracer
    from opentelemetry import trace

    _tracer = (provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)


def disable() -> None:
    """Stop tracing: graphs built from now on get no callback, so their runs record no span."""
    global _tracer
    _tracer = None


@contextlib.contextmanager
def tracing_to(provider: Any) -> Iterator[None]:
    """Graphs built inside the block are traced with ``provider``; the switch is as it was after the block."""
    global _tracer
    before = _tracer
    enable(provider)
    try:
        yield
    finally:
        _tracer = before


def enabled() -> bool:
    """True when graphs built now are traced (decided from the environment on the first call, see the module)."""
    global _tracer
    if _tracer is _UNDECIDED:
        _tracer = _tracer_from_env()
    return _tracer is not None


def _tracer_from_env() -> Any:
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters in ("", "none") or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk._configuration import _initialize_components  # the SDK's own autoconfiguration
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from agentlab.core.tracing_export import WarnOnce

        if not isinstance(trace.get_tracer_provider(), TracerProvider):  # nobody configured the SDK yet
            _initialize_components(export_span_processor=lambda exporter: BatchSpanProcessor(WarnOnce(exporter)))
        return trace.get_tracer(TRACER_NAME)
    except Exception as exc:  # noqa: BLE001 (a bad configuration turns tracing off, never the run)
        warnings.warn(TRACES_OFF.format(error=f"{type(exc).__name__}: {exc}", exporters=exporters), RuntimeWarning,
                      stacklevel=1)
        return None


def traced(graph: Any, safeguards_name: str | None = None, *, provider: Any = None) -> Any:
    """``graph`` (compiled) with the callback that writes its runs' spans; ``graph`` itself when tracing is off.
    ``provider``: trace with this ``TracerProvider`` whatever the switch says (the bench's traced episodes)."""
    if provider is not None:
        tracer = provider.get_tracer(TRACER_NAME)
    elif enabled():
        tracer = _tracer
    else:
        return graph
    return graph.with_config(callbacks=[SpanCallback(tracer, safeguards_name)])


def record_batch(config: Any, batch: Any, *, thread_id: str, savepoint: str | None) -> None:
    """The ``execute_tool`` spans of ``batch`` (a :class:`agentlab.core.batch.BatchResult`), children of the run's
    ``invoke_agent`` span, found through ``config`` (the tools node's). Nothing when the run is not traced (its
    graph was built with tracing off: no :class:`SpanCallback` among its callbacks). ``savepoint``: the name of
    the savepoint each call ran in (None: the batch ran without savepoints)."""
    callbacks = config.get("callbacks") if config else None
    handler = next((h for h in getattr(callbacks, "handlers", ()) if isinstance(h, SpanCallback)), None)
    if handler is not None:
        handler.tool_spans(getattr(callbacks, "parent_run_id", None), batch, thread_id=thread_id, savepoint=savepoint)


class SpanCallback(BaseCallbackHandler):
    """LangChain callbacks -> spans: a root chain (the graph run) opens ``invoke_agent``, a chat model call opens
    ``chat`` under it; the tools node adds its calls' spans with :meth:`tool_spans`. Keyed by LangChain run id,
    so one graph may run many threads at once."""

    run_inline = True  # called on the event loop, in order, not in a thread pool

    def __init__(self, tracer: Any, safeguards_name: str | None = None) -> None:
        from opentelemetry import trace

        self.tracer, self.trace, self.safeguards_name = tracer, trace, safeguards_name
        self.spans: dict[UUID, Any] = {}  # open invoke_agent and chat spans
        self.parents: dict[UUID, UUID | None] = {}  # every run seen -> its parent run

    def root(self, run_id: UUID | None) -> Any:
        """The ``invoke_agent`` span of the run ``run_id`` belongs to (None: not one of this graph's runs)."""
        while run_id is not None and run_id in self.parents:
            run_id = self.parents[run_id]
        return self.spans.get(run_id) if run_id is not None else None

    def _parent(self, run_id: UUID | None) -> Any:
        span = self.root(run_id)
        return self.trace.set_span_in_context(span) if span is not None else None

    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, metadata=None, **kwargs) -> None:
        if parent_run_id is not None and (parent_run_id in self.parents or parent_run_id in self.spans):
            self.parents[run_id] = parent_run_id  # a node or a runnable inside one
            return
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT_NAME}
        thread_id = (metadata or {}).get("thread_id")
        if thread_id is not None:
            attributes["gen_ai.conversation.id"] = str(thread_id)
        if self.safeguards_name:
            attributes[PRESET] = self.safeguards_name
        self.spans[run_id] = self.tracer.start_span(f"invoke_agent {AGENT_NAME}", attributes=attributes)

    def on_chain_end(self, outputs, *, run_id, **kwargs) -> None:
        self._end(run_id)

    def on_chain_error(self, error, *, run_id, **kwargs) -> None:
        from langgraph.errors import GraphBubbleUp  # an interrupt ends the run, it is no error

        self._end(run_id, None if isinstance(error, GraphBubbleUp) else error)

    def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, metadata=None,
                            invocation_params=None, **kwargs) -> None:
        meta, params = metadata or {}, invocation_params or {}
        model = meta.get("ls_model_name") or params.get("model") or params.get("model_name")
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": str(meta.get("ls_provider") or
                                                                                  params.get("_type") or "unknown")}
        if model:
            attributes["gen_ai.request.model"] = str(model)
        self.parents[run_id] = parent_run_id
        self.spans[run_id] = self.tracer.start_span(f"chat {model}" if model else "chat",
                                                    context=self._parent(parent_run_id),
                                                    kind=self.trace.SpanKind.CLIENT, attributes=attributes)

    def on_llm_end(self, response, *, run_id, **kwargs) -> None:
        span = self.spans.get(run_id)
        if span is not None:
            generations = [g for gens in response.generations for g in gens]
            message = getattr(generations[0], "message", None) if generations else None
            usage = getattr(message, "usage_metadata", None) or {}
            for key in ("input_tokens", "output_tokens"):
                if usage.get(key) is not None:
                    span.set_attribute(f"gen_ai.usage.{key}", int(usage[key]))
            model = (getattr(message, "response_metadata", None) or {}).get("model_name")
            if model:
                span.set_attribute("gen_ai.response.model", str(model))
        self._end(run_id)

    def on_llm_error(self, error, *, run_id, **kwargs) -> None:
        self._end(run_id, error)

    def _end(self, run_id: UUID, error: BaseException | None = None) -> None:
        self.parents.pop(run_id, None)
        span = self.spans.pop(run_id, None)
        if span is None:
            return
        if error is not None:
            span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
            span.set_status(self.trace.StatusCode.ERROR, type(error).__name__)
        span.end()

    def tool_spans(self, node_run_id: UUID | None, batch: Any, *, thread_id: str, savepoint: str | None) -> None:
        """One ``execute_tool`` span per call of ``batch``, under the ``invoke_agent`` span of ``node_run_id``'s run.
        A call that ran spans its own time (:attr:`~agentlab.core.batch.CallResult.started_ns`, ``latency_ms``);
        one that never ran (refused before any SQL, replayed, never reached) is a point at the batch's answer."""
        context, now = self._parent(node_run_id), time.time_ns()
        for r in batch.results:
            start = r.started_ns or now
            attributes = {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": r.tool, "gen_ai.tool.call.id": r.call_id,
                "gen_ai.tool.type": "function", "gen_ai.conversation.id": thread_id, OUTCOME: r.outcome.value,
                ATTEMPT: batch.attempt, BATCH_CALLS: len(batch.results), BATCH_ROLLED_BACK: batch.rolled_back,
            }
            if r.category:
                attributes[CATEGORY] = r.category
            if r.started_ns and savepoint:
                attributes[SAVEPOINT] = savepoint
            tr = r.translation
            if tr is not None and tr.sqlstate:
                attributes[SQLSTATE] = tr.sqlstate
            span = self.tracer.start_span(f"execute_tool {r.tool}", context=context, start_time=start,
                                          attributes=attributes)
            if r.outcome.value == "failed":  # the SQLSTATE, else the exception's class, else the category
                category = str(r.category or "failed")
                span.set_attribute("error.type", (tr and (tr.sqlstate or tr.error_class)) or category)
                span.set_status(self.trace.StatusCode.ERROR, category)
            span.end(end_time=start + int(r.latency_ms * 1_000_000) if r.started_ns else now)
