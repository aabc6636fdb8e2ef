"""Episode rates for the bench: the full-safety graph against the same graph with no-op tools, and with
tools that send the full node's SQL from plain psycopg.

The graphs are the kit's graph (:func:`agentlab.core.graph.build_graph`: agent, tools, agent, with the
retry policy, the orphan repair and the node events), compiled once, with the scripted model routed
per thread as in the lab. They differ only in the tools node: :class:`agentlab.core.batch.TransactionalToolsNode`
under the ``full`` preset, :class:`NoOpToolsNode`, which answers every call as applied without a
statement, or :class:`PlainSQLToolsNode`, which sends the statements the full node sends for the batch
(:func:`agentlab.bench.batch.plain_batch`) and nothing else: no validation, translation, events or
ToolMessage building of the kit's. It is the bound on what the full node could reach with this SQL: the
full episode over the plain-SQL one is the cost of the kit's own code, the plain-SQL one over the no-op
one what the statements themselves cost. An episode is the refund story without its hallucination (one batch of three calls, then
the closing answer): three super-steps. Its customer is created before the clock starts. ``traced`` is the
full graph with OpenTelemetry on (:mod:`agentlab.core.tracing`, the SDK's batch processor, spans kept in
memory): the traced over the full episode is what tracing costs a run; ``full`` itself is tracing off.

Checkpointers: the Postgres saver (``AsyncPostgresSaver`` on the harness's checkpointer pool) with
durability ``sync`` (a checkpoint per super-step, written before the next one starts), ``async`` (written
while the next one runs) and ``exit`` (once, when the run ends), and LangGraph's ``InMemorySaver``.

Sources: LangGraph docs "Persistence" (durability modes), "Checkpointer libraries".
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence

from langchain_core.messages import HumanMessage

from agentlab.bench.batch import BatchCalls, plain_batch
from agentlab.core.batch import BatchResult, CallResult, Outcome, TransactionalToolsNode
from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.core.tracing import traced
from agentlab.lab.process import ModelRouter
from agentlab.sim.model import ScriptedChatModel

DURABILITIES = ("sync", "async", "exit")
SAVERS = (*DURABILITIES, "memory")  # "memory": InMemorySaver (durability async)
KINDS = ("full", "noop", "plainsql", "traced")  # traced: full with OpenTelemetry on (spans kept in memory)
NOOP_RESULT = '{"ok":true}'
CREATE_CUSTOMERS = """
INSERT INTO customers (tenant_id, name, credit_cents)
SELECT %s, 'Bench Customer ' || n, %s FROM generate_series(1, %s) AS n
RETURNING id
"""


def _span_sink():
    """An OpenTelemetry SDK tracer provider whose spans go, in the SDK's background batches, to memory: what
    tracing costs the run itself, whatever an exporter then costs its own thread."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError as exc:
        raise RuntimeError("the bench's traced episodes need the OpenTelemetry SDK: pip install "
                           "'agentlab[tracing]' (or -r requirements.txt)") from exc

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    return provider


class NoOpToolsNode(TransactionalToolsNode):
    """A tools node that answers every tool call as applied and sends no SQL (the bench's baseline)."""

    async def run_batch(self, tool_calls, *, thread_id: str, tenant_id: str | None = None, attempt: int = 1,
                        final_attempt: bool = False, **kwargs) -> BatchResult:
        results = [CallResult(i, str(c.get("id")), str(c.get("name")), Outcome.APPLIED, NOOP_RESULT, result={})
                   for i, c in enumerate(tool_calls)]
        return BatchResult(results, False, attempt)


class PlainSQLToolsNode(NoOpToolsNode):
    """A tools node that sends the refund batch's SQL exactly as the full node sends it, from plain psycopg
    (:func:`agentlab.bench.batch.plain_batch`: the same statements, pipelined the same way, one cent where
    the script asks for more), then answers every call as applied, as :class:`NoOpToolsNode` does.

    Raises:
        KeyError: the batch is not the refund story's three calls (the bench only plays that one).
    """

    async def run_batch(self, tool_calls, *, thread_id: str, tenant_id: str | None = None, attempt: int = 1,
                        final_attempt: bool = False, **kwargs) -> BatchResult:
        memo = next(c for c in tool_calls if c.get("name") == "CreateCreditMemo")["args"]
        await plain_batch(self.pool, BatchCalls(thread_id, int(memo["customer_id"]), str(memo["reference"]),
                                                tuple(str(c.get("id")) for c in tool_calls)))
        return await super().run_batch(tool_calls, thread_id=thread_id, tenant_id=tenant_id, attempt=attempt)


class EpisodeBench:
    """Compiled graphs for every (kind, saver) pair on one harness, and a timer of episodes.

    Args:
        h: the harness (its pools, saver and events serve both graphs).
    """

    def __init__(self, h):
        from langgraph.checkpoint.memory import InMemorySaver

        self.h = h
        self.scenario = h.scenario("refund").clean()  # the harness's domain: billing for the bench
        self.models: dict[str, ScriptedChatModel] = {}
        self.memory = InMemorySaver()
        sg = preset("full")
        nodes = {"full": TransactionalToolsNode(h.pool, sg, toolset=h.toolset, provider=h.provider, events=h.events,
                                               error_hints=h.domain.error_hints),
                 "noop": NoOpToolsNode(h.pool, sg, toolset=h.toolset, provider=h.provider, events=h.events),
                 "plainsql": PlainSQLToolsNode(h.pool, sg, toolset=h.toolset, provider=h.provider, events=h.events)}
        nodes["traced"] = nodes["full"]
        self.spans = _span_sink()
        router = ModelRouter(self.models)
        self.graphs = {}
        for kind, node in nodes.items():
            provider = self.spans if kind == "traced" else None
            pg = traced(build_graph(router, node, checkpointer=h.saver), "full", provider=provider)
            mem = traced(build_graph(router, node, checkpointer=self.memory), "full", provider=provider)
            self.graphs.update({(kind, d): pg for d in DURABILITIES})
            self.graphs[(kind, "memory")] = mem
        self._threads = itertools.count(1)

    async def _customers(self, n: int) -> list[int]:
        spec = self.scenario.customers[0]
        async with self.h.pool.connection() as conn:
            cur = await conn.execute(CREATE_CUSTOMERS, (spec.tenant_id, spec.credit_cents, n))
            return [r[0] for r in await cur.fetchall()]

    async def _prepare(self, kind: str, saver: str, episodes: int) -> list[dict]:
        """Customers, models and run configs of ``episodes`` episodes (before the clock starts)."""
        runs = []
        for cid in await self._customers(episodes):
            thread = f"bench-{kind}-{saver}-{next(self._threads)}"
            self.models[thread] = ScriptedChatModel(script=self.scenario.script([cid]), seed=cid)
            runs.append(run_config(thread, tenant_id=self.scenario.tenant_id))
        return runs

    async def _episode(self, kind: str, saver: str, config: dict) -> float:
        """One episode on the (``kind``, ``saver``) graph; its wall seconds.

        Raises:
            RuntimeError: the episode did not end with the closing answer (the bench would time a failure).
        """
        graph = self.graphs[(kind, saver)]
        durability = "async" if saver == "memory" else saver
        t0 = time.perf_counter()
        state = await graph.ainvoke({"messages": [HumanMessage(self.scenario.prompt)]}, config, durability=durability)
        elapsed = time.perf_counter() - t0
        self.models.pop(config["configurable"]["thread_id"], None)
        if state["messages"][-1].content != ScriptedChatModel.model_fields["final_text"].default:
            raise RuntimeError(f"bench episode on {kind}/{saver} did not finish: {state['messages'][-1]!r}")
        return elapsed

    async def rate(self, kind: str, saver: str, episodes: int) -> float:
        """Episodes per second on the (``kind``, ``saver``) graph: one over the median episode's wall time."""
        times = [await self._episode(kind, saver, c) for c in await self._prepare(kind, saver, episodes)]
        return 1 / statistics.median(times)

    async def rates(self, episodes: int, repeats: int, savers: Sequence[str] = SAVERS,
                    progress=None) -> dict[tuple[str, str], list[float]]:
        """``{(kind, saver): [episodes per second per repeat]}``: per repeat and saver, ``episodes`` of each
        kind alternating one by one (so that a busy moment of the machine hits both), each kind's rate one
        over its median episode time."""
        out: dict[tuple[str, str], list[float]] = {(k, s): [] for s in savers for k in KINDS}
        for _ in range(repeats):
            for saver in savers:
                runs = {kind: await self._prepare(kind, saver, episodes) for kind in KINDS}
                times: dict[str, list[float]] = {kind: [] for kind in KINDS}
                for i in range(episodes):
                    for kind in (KINDS if i % 2 == 0 else KINDS[::-1]):
                        times[kind].append(await self._episode(kind, saver, runs[kind][i]))
                for kind in KINDS:
                    out[(kind, saver)].append(1 / statistics.median(times[kind]))
                if progress is not None:
                    progress()
        return out
