"""A LangGraph agent whose every life is a real operating-system process: the lab's client for crashes by real
process death (:mod:`agentlab.lab.nemesis.death`).

Each turn starts ``python -m agentlab.lab.clients.child`` (:mod:`agentlab.lab.clients.child`), which opens its
own pools, checkpointer and provider connection on the episode's database, builds the agent by name and plays
the turn. When the nemesis kills it (exit status :data:`agentlab.lab.nemesis.death.EXIT_CODE`) nothing of it
survives, and the next turn is a new child that resumes the thread from its last checkpoint. This process
(the lab's) only reads the end state through a checkpointer of its own, drains the outbox and checks.

Played by :func:`agentlab.lab.loop.run`; ``Yardstick.run`` makes one per episode under a fault with
``process_death``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langgraph.errors import EmptyInputError

from agentlab.core.errors import AgentlabError, SimulatedCrash
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.clients.agent_process import EpisodeProcess
from agentlab.lab.clients.graph_agent import agent_episode, build_agent
from agentlab.lab.nemesis.death import EXIT_CODE, flag_name
from agentlab.runtime.harness import Episode
from agentlab.sim.model import ScriptedChatModel

CHILD_TIMEOUT_S = 120.0
"""How long one life of the agent may take before the lab kills it (a hang's ceiling, not a timing)."""


class ChildFailed(AgentlabError):
    """The agent's process ended in an unplanned way (not the nemesis's exit status, no result line)."""


class ChildRaised(Exception):
    """What the agent's run raised in its process (``description``: the table's words for it)."""

    def __init__(self, description: str):
        super().__init__(description)
        self.description = description


class ChildProcessClient:
    """One episode of a LangGraph agent, each life in a child process. ``run`` is the
    :class:`agentlab.lab.clients.agent_process.AgentRun`; ``spec`` the agent's
    :class:`agentlab.lab.agents.AgentSpec` and ``agent_name`` the name the child rebuilds it from
    (:func:`agentlab.lab.agents.resolve_agent`; default ``spec.name``); ``durability`` is
    LangGraph's. ``lives`` counts the child processes started; ``exit_codes`` lists their exit statuses."""

    def __init__(self, spec, run, *, script: list, config: dict, durability: str, fault_name: str,
                 agent_name: str | None = None):
        self.spec = spec
        self.agent_name = agent_name or spec.name
        self.run = run
        self.script = script
        self.config = config
        self.durability = durability
        self.fault_name = fault_name
        self.seed = run.seed
        self.reader: EpisodeProcess | None = None
        self.exit_codes: list[int] = []

    def arms_after_build(self, nemesis) -> bool:
        return False  # the flag is armed before any child starts

    async def open(self) -> None:
        """The lab's own process on the episode's database: it reads the thread's checkpoints."""
        if self.reader is None:
            self.reader = await EpisodeProcess(self.run.harness.url).open()
            self.run.saver = self.reader.saver

    async def build(self) -> None:
        pass  # each child builds the agent itself

    def child_spec(self, prompt: str | None) -> dict[str, Any]:
        r, h = self.run, self.run.harness
        return {"url": h.url, "domain": h.domain.name, "agent": self.agent_name, "scenario": r.scenario.name,
                "seed": self.seed, "thread_id": r.thread_id, "customer_ids": r.customer_ids, "prompt": prompt,
                "durability": self.durability, "config": self.config, "fault": self.fault_name,
                "death_flag": flag_name(r.thread_id, self.fault_name)}

    async def invoke(self, prompt: str | None) -> dict:
        """One life: a child process plays the turn. Raises :class:`SimulatedCrash` when the nemesis killed it,
        ``EmptyInputError`` when a resume found no checkpoint, :class:`ChildRaised` with what the agent raised,
        :class:`ChildFailed` when it ended otherwise."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentlab.lab.clients.child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(json.dumps(self.child_spec(prompt)).encode()),
                                              CHILD_TIMEOUT_S)
        except (TimeoutError, asyncio.CancelledError):
            proc.kill()
            await proc.wait()
            raise
        self.exit_codes.append(proc.returncode)
        if proc.returncode == EXIT_CODE:
            self.run.notes.setdefault("crashes", []).append(f"process {proc.pid} died (exit {EXIT_CODE})")
            raise SimulatedCrash(f"the agent's process {proc.pid} died (exit status {EXIT_CODE})")
        lines = out.decode(errors="replace").strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise ChildFailed(f"the agent's process exited with status {proc.returncode}: {' | '.join(tail)}")
        result = json.loads(lines[-1])
        if result["no_checkpoint"]:
            raise EmptyInputError(f"thread {self.run.thread_id} has no checkpoint to resume")
        if result["raised"] is not None:
            raise ChildRaised(result["raised"])
        return await self.state()

    def describe(self, exc: BaseException) -> str:
        return exc.description if isinstance(exc, ChildRaised) else f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.run.raised = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        pass  # a child's leftover work ended with it

    async def recover(self, nemesis) -> None:
        pass  # the next turn is a new child process

    async def resubmit(self) -> None:
        self.seed = self.run.seed + 1  # the prompt sent again: the model's tool call ids are new

    async def state(self) -> dict:
        graph = build_agent(self.spec, self.reader, ScriptedChatModel(script=self.script, seed=self.seed), self.run,
                            self.run.harness.domain, self.run.harness.events)
        snapshot = await graph.aget_state(self.config)
        return snapshot.values if snapshot is not None else {}

    async def new_worker(self) -> OutboxWorker:
        r = self.run
        return OutboxWorker(r.harness.pool, r.network_provider, thread_id=r.thread_id)

    async def flush(self) -> None:
        await self.run.harness.events.flush()

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.close()
        self.run.notes["exit_codes"] = list(self.exit_codes)

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        return agent_episode(self.spec, self.run, state)
