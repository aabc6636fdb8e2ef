"""The kit's own graph as the lab's client: the agent under test is :func:`agentlab.core.graph.build_graph` under
a preset, in an agent process of a :class:`agentlab.lab.runner.Lab` (a crash resumes the thread in the Lab's
restarted process, with a new tools node and model instance).

Played by :func:`agentlab.lab.loop.run`; ``Lab.run`` makes one per episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import HumanMessage

from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.process import AgentProcess
from agentlab.runtime.harness import Episode


class KitClient:
    """One episode of the kit's graph. ``run`` is the :class:`agentlab.lab.runner.EpisodeRun` a fault acts on;
    ``episode`` the :class:`agentlab.runtime.harness.Episode` this client fills (its ``error`` as
    ``"Type: message"``); ``model`` is the first life's chat model, ``make_model(script, seed)`` builds the one
    of each later life;
    ``durability`` is LangGraph's (``"sync"``, ``"async"`` or ``"exit"``)."""

    def __init__(self, lab, run, episode: Episode, *, model, script: list, config: dict, durability: str,
                 make_model: Callable[[list, int], Any]):
        self.lab = lab
        self.run = run
        self.ep = episode
        self.script = script
        self.config = config
        self.durability = durability
        self.model = model  # the first life's chat model (the prompt was written for it)
        self.make_model = make_model
        self.process: AgentProcess = run.process
        self.active: AgentProcess = run.process  # the process the thread runs in now

    def arms_after_build(self, nemesis) -> bool:
        return True  # the fault hooks into the episode's own tools node, registered by build()

    async def open(self) -> None:
        pass  # the Lab's process is open already

    async def build(self) -> None:
        self.process.register(self.run.thread_id, self.model, self.run.node)

    async def invoke(self, prompt: str | None) -> dict:
        value = {"messages": [HumanMessage(prompt)]} if prompt is not None else None
        return await self.active.graph(self.run.safeguards).ainvoke(value, self.config, durability=self.durability)

    def describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.ep.error = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        pass  # the kit's node answers every call before its step ends: nothing is left running

    async def recover(self, nemesis) -> None:
        """Resume in the Lab's restarted process: a new tools node and model; a fault that lives in the code
        (``nemesis.rearms``) is armed again on them."""
        r = self.run
        self.active = await self.lab.restart_process()
        node = self.active.node(r.safeguards)
        if nemesis.rearms:
            r.process, r.node = self.active, node
            await nemesis.arm(r)
        self.active.register(r.thread_id, self.make_model(self.script, r.seed), node)

    async def resubmit(self) -> None:
        r = self.run  # the prompt sent again: the model's tool call ids are new (seed + 1)
        self.active.register(r.thread_id, self.make_model(self.script, r.seed + 1), self.active.node(r.safeguards))

    async def state(self) -> dict:
        snapshot = await self.active.graph(self.run.safeguards).aget_state(self.config)
        return snapshot.values if snapshot is not None else {}

    async def new_worker(self) -> OutboxWorker:
        restarted = await self.lab.restart_process()
        return OutboxWorker(restarted.pool, self.lab.harness.provider, thread_id=self.run.thread_id)

    async def flush(self) -> None:
        pass  # the Lab flushes the harness's events when it closes

    async def close(self) -> None:
        self.process.release(self.run.thread_id)
        if self.active is not self.process:
            self.active.release(self.run.thread_id)

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        ep = self.ep
        if drain is not None:
            ep.drain = drain
        ep.error = ep.error or state.get("model_error")  # a turn that ended on an unreadable reply (C47)
        ep.messages = list(state.get("messages", []))
        ep.rollbacks_total = state.get("rollbacks_total", 0)
        ep.escalated = bool(state.get("escalated", False))
        return ep
