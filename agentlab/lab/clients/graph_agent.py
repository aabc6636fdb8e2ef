"""A LangGraph agent as the lab's client: the prebuilt ``ToolNode`` graph, LangChain's ``create_agent``, the kit
under a preset or your own factory (:class:`agentlab.lab.agents.AgentSpec`), built as its user builds it; each
life of it is a process of its own (:class:`agentlab.lab.clients.agent_process.EpisodeProcess`: its pools, its saver), and
a crash resumes the thread in a new one.

Played by :func:`agentlab.lab.loop.run`; ``Yardstick.run`` makes one per episode.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import HumanMessage

from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.agents import AgentContext, AgentSpec, as_domain_messages, describe_raised
from agentlab.runtime.harness import Episode


def build_agent(spec: AgentSpec, process, model, run, domain, events, *, pool=None):
    """``spec``'s compiled graph in ``process`` (an :class:`agentlab.lab.clients.agent_process.EpisodeProcess`),
    on ``pool`` (default the process's), with ``model``; the provider it is handed is ``run.agent_provider``
    (a fault's) or else ``run.network_provider``. Sets ``run.node`` to the tools step the build exposed (None
    when it exposes none)."""
    ctx = AgentContext(model, pool or process.pool, run.agent_provider or run.network_provider, process.saver,
                       domain, events, safeguards=run.safeguards if spec.safeguards is not None else None)
    graph = spec.build(ctx)
    run.node = ctx.exposed.get("node")
    return graph


def agent_episode(spec: AgentSpec, run, state: dict) -> Episode:
    """The :class:`agentlab.runtime.harness.Episode` the checker reads of an agent's end ``state``: its messages
    kept in ``run.messages`` as the agent wrote them, and given to the checker with the domain's tool names."""
    sc = run.scenario
    run.messages = list(state.get("messages", []))
    return Episode(sc.name, spec.name, run.thread_id, run.seed, run.customer_ids, run.safeguards.schema, sc.tenant_id,
                   messages=as_domain_messages(run.messages, dict(spec.tool_names)))


class GraphAgentClient:
    """One episode of a LangGraph agent. ``run`` is the :class:`agentlab.lab.clients.agent_process.AgentRun` a fault acts
    on (its ``raised`` names what the agent raised, :func:`agentlab.lab.agents.describe_raised`); ``needs``
    are the fault's (``"node_hooks"``: armed once the build exposed the tools step); ``durability`` is
    LangGraph's."""

    def __init__(self, yardstick, spec, run, *, needs, script: list, config: dict, durability: str):
        self.yardstick = yardstick
        self.spec = spec
        self.run = run
        self.needs = tuple(needs)
        self.script = script
        self.config = config
        self.durability = durability
        self.processes: list = []
        self.process: Any = None
        self.graph: Any = None
        self.before: set = set()

    def arms_after_build(self, nemesis) -> bool:
        return "node_hooks" in self.needs

    async def open(self) -> None:
        """A new process (pools, saver) for this life of the agent, the provider's wire pointed at it."""
        if not self.processes:
            self.before = set(asyncio.all_tasks())  # what runs before the agent: not the agent's work
        self.process = await self.yardstick.open_process(self.processes)
        self.run.saver = self.process.saver
        self.run.network_provider.process_wire = self.process.wire

    async def build(self, seed: int | None = None) -> None:
        seed = self.run.seed if seed is None else seed
        self.graph = self.yardstick.build(self.spec, self.process, self.script, seed, self.run)

    async def invoke(self, prompt: str | None) -> dict:
        value = {"messages": [HumanMessage(prompt)]} if prompt is not None else None
        return await self.graph.ainvoke(value, self.config, durability=self.durability)

    def describe(self, exc: BaseException) -> str:
        return describe_raised(exc)

    def record_error(self, exc: BaseException | None) -> None:
        self.run.raised = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        await self.yardstick.quiet(self.before)  # a ToolNode sibling may still be in flight

    async def recover(self, nemesis) -> None:
        """A new process and the agent built again in it (the provider it is handed: the network's again); a
        fault that lives in the code (``nemesis.rearms``) is armed again."""
        await self.open()
        self.run.agent_provider = None
        await self.build()
        if nemesis.rearms:
            await nemesis.arm(self.run)

    async def resubmit(self) -> None:
        await self.build(self.run.seed + 1)  # the prompt sent again: the model's tool call ids are new

    async def state(self) -> dict:
        snapshot = await self.graph.aget_state(self.config)
        return snapshot.values if snapshot is not None else {}

    async def new_worker(self) -> OutboxWorker:
        r = self.run
        return OutboxWorker(r.harness.pool, r.network_provider, thread_id=r.thread_id)

    async def flush(self) -> None:
        await self.run.harness.events.flush()

    async def close(self) -> None:
        for p in self.processes:
            await p.close()

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        return agent_episode(self.spec, self.run, state)
