"""Structured events: one per tool call and per node execution, to ``logging`` and the events table.

An event holds thread, node, tool, tool call id, outcome, category, SQLSTATE, error class, the full
error detail (passwords redacted; never shown to the model), attempt and latency in milliseconds.
Events go to the ``agentlab.core.events`` logger at once and to the ``events`` table in batches
(:meth:`EventLog.flush`), outside the business transaction, so a rolled-back batch keeps its record.

No event of an applied call is lost for good (case C38). The ledger row commits with the call, so
the event is recoverable from it: every flush, in its own transaction, adds an ``applied`` event
(detail :data:`RECOVERED_DETAIL`) for each ledger row of the flushed threads that has none, as after
a process killed before its buffer was written; :meth:`EventLog.recover` does it for every thread.
A flush that fails keeps its rows buffered (up to ``max_buffer``) and retries them at the next
flush; what is dropped (a full buffer, :meth:`EventLog.abandon`) is counted in ``dropped`` and logged.

Every event has a ``kind``: ``node`` (one per node execution, written only by
:func:`observe_node`, with super-step, start time and token counts),
``call`` (one per tool call in a batch, written by the tools node) or ``note`` (anything else a node
wants on record: an infrastructure error, orphans answered, an escalation). Count node executions
from ``node`` events and tool calls from ``call`` events, so nothing is counted twice.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.runtime import Runtime

from agentlab.core.storable import storable_text

log = logging.getLogger("agentlab.core.events")

EVENT_COLUMNS = (
    "thread_id", "node", "tool_name", "tool_call_id", "outcome", "category", "sqlstate", "error_class",
    "detail", "attempt", "latency_ms", "kind", "step", "started_at", "input_tokens", "output_tokens",
)
EVENT_KINDS = ("node", "call", "note")
_COLUMNS = frozenset(EVENT_COLUMNS)
COPY_EVENTS = f"COPY events ({', '.join(EVENT_COLUMNS)}) FROM STDIN"
RECOVERED_DETAIL = "recovered from the ledger: the call committed, its event was not written"
# An ``applied`` call event for each ledger row (of the threads given, or all when NULL) that has none: a
# call id's n-th ledger row (a model that reuses ids has one per occurrence) needs n applied events.
RECOVER_FROM_LEDGER = f"""
INSERT INTO events (thread_id, node, tool_name, tool_call_id, outcome, kind, attempt, started_at, detail)
SELECT l.thread_id, 'tools', l.tool_name, l.tool_call_id, 'applied', 'call', l.attempt, l.created_at,
       '{RECOVERED_DETAIL}'
FROM (SELECT t.thread_id, t.tool_name, t.tool_call_id, t.attempt, t.created_at,
             row_number() OVER (PARTITION BY t.thread_id, t.tool_call_id ORDER BY t.created_at, t.occurrence) AS n
      FROM tool_executions t
      WHERE %(threads)s::text[] IS NULL OR t.thread_id = ANY(%(threads)s::text[])) l
WHERE l.n > (SELECT count(*) FROM events e WHERE e.thread_id = l.thread_id AND e.tool_call_id = l.tool_call_id
                                            AND e.kind = 'call' AND e.outcome = 'applied')
ORDER BY l.created_at
"""


class EventLog:
    """Buffers events and writes them to the events table.

    Args:
        pool: an ``AsyncConnectionPool`` on the kit's database, or None to log only.
        flush_at: buffered events that trigger a write.
        max_buffer: events kept for a retry while flushes fail; beyond it the oldest are dropped
            (counted in ``dropped``, logged).

    Attributes:
        dropped: events dropped without being written (a full buffer, :meth:`abandon`).
        failed_flushes: flushes that could not write (their rows stayed buffered).
        recovered: ``applied`` events rebuilt from the ledger by flushes and :meth:`recover`.
    """

    def __init__(self, pool=None, *, flush_at: int = 200, max_buffer: int = 10_000):
        self.pool = pool
        self.flush_at = flush_at
        self.max_buffer = max_buffer
        self._buffer: list[tuple] = []
        self.server_lost = False  # set by :meth:`abandon`: flushes drop their rows instead of waiting
        self.dropped = 0
        self.failed_flushes = 0
        self.recovered = 0

    def abandon(self) -> None:
        """The server is gone: drop what is buffered (logged as a count, added to ``dropped``) and every
        later flush, instead of waiting for a connection that will not come. Applied calls' events can
        be rebuilt from the ledger later (:meth:`recover`)."""
        if self._buffer:
            log.warning("%d events not written: the database server is gone", len(self._buffer))
            self.dropped += len(self._buffer)
        self._buffer, self.server_lost = [], True

    def record(self, node: str, outcome: str, **fields: Any) -> None:
        """Record one event; ``fields`` are named as :data:`EVENT_COLUMNS`."""
        unknown = fields.keys() - _COLUMNS
        if unknown:
            raise TypeError(f"unknown event fields: {sorted(unknown)}")
        fields.setdefault("attempt", 1)
        fields.setdefault("kind", "call" if fields.get("tool_call_id") else "note")
        if fields["kind"] not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {fields['kind']!r}; one of {EVENT_KINDS}")
        fields["node"], fields["outcome"] = node, outcome
        row = {k: _storable(v) for k, v in fields.items()}
        level = logging.WARNING if outcome == "infrastructure_error" else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "event %s", {k: v for k, v in row.items() if v is not None}, extra={"agentlab_event": row})
        self._buffer.append(tuple(map(row.get, EVENT_COLUMNS)))
        if len(self._buffer) > self.max_buffer:
            self._drop_oldest(len(self._buffer) - self.max_buffer)

    def _drop_oldest(self, n: int) -> None:
        del self._buffer[:n]
        self.dropped += n
        log.warning("%d events dropped: the buffer holds at most %d while flushes fail (%d dropped in all)",
                    n, self.max_buffer, self.dropped)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    async def maybe_flush(self) -> None:
        if len(self._buffer) >= self.flush_at:
            await self.flush()

    async def flush(self) -> int:
        """Write buffered events, then rebuild any missing ``applied`` event of the flushed threads from
        the ledger (one transaction); return how many rows were written (recovered ones included).

        Failures are logged, never raised: the rows stay buffered and the next flush retries them
        (``failed_flushes`` counts the failures).
        """
        rows, self._buffer = self._buffer, []
        if not rows or self.pool is None or self.server_lost:
            return 0
        threads = sorted({r[0] for r in rows if r[0] is not None})
        try:
            async with self.pool.connection() as conn, conn.transaction():
                async with conn.cursor() as cur, cur.copy(COPY_EVENTS) as copy:  # one COPY, not a statement per row
                    for row in rows:
                        await copy.write_row(row)
                recovered = (await conn.execute(RECOVER_FROM_LEDGER, {"threads": threads})).rowcount
        except Exception as exc:  # observability must never break the run (nor flood a failing one)
            self.failed_flushes += 1
            self._buffer[:0] = rows  # kept, in order, for the next flush
            if len(self._buffer) > self.max_buffer:
                self._drop_oldest(len(self._buffer) - self.max_buffer)
            log.warning("could not write %d events (%s: %s); they stay buffered for the next flush", len(rows),
                        type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
            return 0
        if recovered:
            self.recovered += recovered
            log.info("%d applied-call events recovered from the ledger", recovered)
        return len(rows) + recovered

    async def close(self) -> None:
        """The last flush: what it cannot write is counted in ``dropped`` and logged, never lost silently."""
        await self.flush()
        if self._buffer:
            log.warning("%d events not written at close (%d flushes failed)", len(self._buffer), self.failed_flushes)
            self.dropped += len(self._buffer)
            self._buffer = []

    async def recover(self, thread_ids: list[str] | None = None) -> int:
        """Flush, then add an ``applied`` event for every ledger row (of ``thread_ids``, or of every
        thread) that has none, as after a process killed before its events were written; return how
        many were added.

        Raises:
            psycopg.Error: the database refused (unlike :meth:`flush`, an explicit call reports it).
        """
        await self.flush()
        if self.pool is None:
            return 0
        async with self.pool.connection() as conn:
            recovered = (await conn.execute(RECOVER_FROM_LEDGER, {"threads": thread_ids})).rowcount
        self.recovered += recovered
        return recovered


def _storable(value: Any) -> Any:
    """Text PostgreSQL can store: a model may send a NUL byte or a lone surrogate in a tool name or id,
    and one such value must not make the whole buffered batch of events fail to insert."""
    return storable_text(value) if isinstance(value, str) else value


# --------------------------------------------------------------------------- node executions

OK = "ok"
ERROR = "error"
INTERRUPTED = "interrupted"

def _tokens(output: Any) -> tuple[int | None, int | None]:
    """Input and output tokens summed over the AIMessages a node returned (None when none reports them)."""
    messages = output.get("messages", []) if isinstance(output, dict) else []
    usages = [m.usage_metadata for m in messages if isinstance(m, AIMessage) and m.usage_metadata]
    if not usages:
        return None, None
    return sum(u.get("input_tokens", 0) for u in usages), sum(u.get("output_tokens", 0) for u in usages)


def _summary(output: Any) -> str | None:
    """A short, id-free account of what a node returned (``"3 tool call(s)"``, ``"answer"``, ...)."""
    if not isinstance(output, dict):
        return type(output).__name__ if output is not None else None
    messages = output.get("messages", [])
    if "messages" in output and not messages:
        return "no messages"
    calls = sum(len(m.tool_calls) for m in messages if isinstance(m, AIMessage))
    tool_messages = sum(isinstance(m, ToolMessage) for m in messages)
    if calls:
        return f"{calls} tool call(s)"
    if any(isinstance(m, AIMessage) for m in messages):
        return "answer"
    if tool_messages:
        return f"{tool_messages} tool message(s)"
    return ", ".join(sorted(output)) or None


def observe_node(name: str, fn: Callable, events: EventLog) -> Callable:
    """Wrap node function ``fn`` so each execution records one ``node`` event under ``name``.

    ``fn`` may take ``(state)``, ``(state, config)``, ``(state, runtime)`` or all three, sync or async;
    the wrapper passes what it declares. Exceptions, ``GraphInterrupt`` included, pass through unchanged.
    """
    params = inspect.signature(fn).parameters
    wants_config, wants_runtime = "config" in params, "runtime" in params

    async def node(state: dict, config: RunnableConfig, runtime: Runtime) -> Any:
        kwargs: dict[str, Any] = {}
        if wants_config:
            kwargs["config"] = config
        if wants_runtime:
            kwargs["runtime"] = runtime
        info = getattr(runtime, "execution_info", None)
        fields = {
            "kind": "node",
            "thread_id": str((config.get("configurable") or {}).get("thread_id", "default")),
            "attempt": getattr(info, "node_attempt", 1) or 1,
            "step": (config.get("metadata") or {}).get("langgraph_step"),
            "started_at": datetime.now(UTC),
        }
        t0 = time.perf_counter()
        try:
            output = fn(state, **kwargs)
            if inspect.isawaitable(output):
                output = await output
        except GraphBubbleUp as exc:
            outcome = INTERRUPTED if isinstance(exc, GraphInterrupt) else type(exc).__name__
            events.record(name, outcome, latency_ms=_ms(t0), **fields)
            raise
        except BaseException as exc:
            events.record(name, ERROR, latency_ms=_ms(t0), error_class=_qualname(exc),
                          sqlstate=getattr(exc, "sqlstate", None), detail=_error_detail(exc), **fields)
            raise
        input_tokens, output_tokens = _tokens(output)
        events.record(name, OK, latency_ms=_ms(t0), detail=_summary(output), input_tokens=input_tokens,
                      output_tokens=output_tokens, **fields)
        await events.maybe_flush()
        return output

    node.__name__ = name
    node.__doc__ = fn.__doc__
    return node


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


def _qualname(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _error_detail(exc: BaseException) -> str:
    from agentlab.core.redact import redact

    return redact(f"{_qualname(exc)}: {exc}")[:2000]
