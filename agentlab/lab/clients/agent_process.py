"""What one life of a LangGraph agent under test holds, and what a fault acts on while it runs.

- :class:`EpisodeProcess`: one agent process of an episode (its autocommit pool, as a user opens one, its
  checkpointer pool and :class:`YardstickSaver`);
- :class:`AgentRun`: one episode of one agent under one fault (what a fault acts on, and the outcome);
- :func:`quiet`: wait for the work an agent left running (a ``ToolNode`` sibling still in flight).

Used by the graph-agent client (:mod:`agentlab.lab.clients.graph_agent`, in this process) and the child
process of the process-death client (:mod:`agentlab.lab.clients.child`); importable from
:mod:`agentlab.lab.yardstick` as before.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from psycopg_pool import AsyncConnectionPool, AsyncNullConnectionPool

from agentlab.core import budget
from agentlab.core.errors import SimulatedCrash
from agentlab.lab.invariants import KINDS
from agentlab.lab.loop import RunAccess
from agentlab.lab.process import CrashableSaver, PoolPair
from agentlab.lab.wire import Wire, WiredConnection
from agentlab.runtime.harness import checkpointer_pool

QUIET_CAP_S = 5.0  # how long an episode waits for the work its agent left running


class YardstickSaver(CrashableSaver):
    """The real ``AsyncPostgresSaver`` (via :class:`agentlab.lab.process.CrashableSaver`), where the
    process can die on the way in: once a thread in :attr:`crash_at_tool_writes` hands it writes that
    carry ToolMessages, the thread is dead in this process (nothing more is written for it) and
    :class:`SimulatedCrash` is raised."""

    def __init__(self, conn, **kwargs):
        super().__init__(conn, **kwargs)
        self.crash_at_tool_writes: set[str] = set()
        self.crashed_here: set[str] = set()
        # a start line (the concurrency family's same-thread runs): called once a run has read the thread's
        # checkpoint, and awaited before its first checkpoint is written
        self.on_first_read = None
        self.before_first_put = None

    async def aget_tuple(self, config):
        found = await super().aget_tuple(config)
        if self.on_first_read is not None:
            self.on_first_read, reached = None, self.on_first_read
            reached()
        return found

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        thread_id = config["configurable"]["thread_id"]
        if thread_id in self.crash_at_tool_writes and any(carries_tool_message(v) for _, v in writes):
            self.crash_at_tool_writes.discard(thread_id)
            self.kill(thread_id)
            self.crashed_here.add(thread_id)
        if thread_id in self.crashed_here:
            raise self._crash(thread_id)
        return await super().aput_writes(config, writes, task_id, task_path)

    async def aput(self, config, checkpoint, metadata, new_versions):
        # LangGraph hands writes to the saver in the background; the step's checkpoint (awaited before
        # the next step under durability "sync") is where the dead process stops for certain
        if config["configurable"]["thread_id"] in self.crashed_here:
            raise self._crash(config["configurable"]["thread_id"])
        if self.before_first_put is not None:
            self.before_first_put, wait = None, self.before_first_put
            await wait()
        return await super().aput(config, checkpoint, metadata, new_versions)

    def _crash(self, thread_id: str) -> SimulatedCrash:
        return SimulatedCrash(f"simulated process crash after the tools step, before its checkpoint (thread {thread_id})")


def carries_tool_message(value: Any) -> bool:
    """Whether a checkpoint write (or a channel's value) holds a ToolMessage."""
    if isinstance(value, ToolMessage):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, ToolMessage) for v in value)


class BudgetedWiredConnection(budget.BudgetedConnection, WiredConnection):
    """A wired connection that holds a slot of the connection budget (:mod:`agentlab.core.budget`)."""


class EpisodeProcess(PoolPair):
    """One agent process of an episode: its own autocommit pool (psycopg_pool's default size, four
    connections, as a user opens one: ``AsyncConnectionPool(url, kwargs={"autocommit": True})``),
    its checkpointer pool and saver."""

    def __init__(self, url: str):
        self.wire = Wire()
        if budget.pooled_slots() is None:
            self.pool = AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False,
                                            connection_class=WiredConnection, configure=self._configure)
        else:  # AGENTLAB_MAX_CONNECTIONS: through the process's gate, nothing idle, as every pool of the kit
            self.pool = AsyncNullConnectionPool(url, kwargs={"autocommit": True}, open=False, max_size=4,
                                                connection_class=BudgetedWiredConnection, configure=self._configure)
        self.checkpointer_pool = checkpointer_pool(url, max_size=2)
        self.saver: YardstickSaver | None = None

    async def _configure(self, conn) -> None:
        conn.wire = self.wire

    async def open(self) -> EpisodeProcess:
        await self.open_pools()
        self.saver = YardstickSaver(self.checkpointer_pool)
        return self


@dataclass
class AgentRun(RunAccess):
    """One episode of one agent under one fault: what a fault acts on while it runs, and the outcome.

    ``pool`` is the harness's (another session: the lock holder, the killer); ``saver``, ``node`` and
    ``worker`` are the episode's own. ``raised`` names what the agent's run raised (``None``: it ended).
    ``status`` is ``"ran"`` or ``"n/a"`` (``reason`` says why). ``costs`` is what the episode cost
    (:func:`agentlab.lab.yardstick.episode_costs`; empty when it was not measured)."""

    agent: str
    fault: str
    scenario: Any = None
    seed: int = 0
    status: str = "ran"
    reason: str = ""
    thread_id: str = ""
    customer_ids: list[int] = field(default_factory=list)
    safeguards: Any = None
    raised: str | None = None
    crashed: bool = False
    worker_crashed: bool = False
    violations: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    harness: Any = None
    saver: Any = None
    node: Any = None
    worker: Any = None
    agent_provider: Any = None
    network_provider: Any = None
    outbox: bool = False
    background: list = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)

    def episode_saver(self):
        return self.saver

    def counts(self) -> dict[str, int]:
        """Violations by kind (every kind of :data:`agentlab.lab.invariants.KINDS`, then a domain's own)."""
        c = Counter(v.kind for v in self.violations)
        return {**{k: c.get(k, 0) for k in KINDS}, **{k: n for k, n in c.items() if k not in KINDS}}


def leftover_tasks(before: set) -> set:
    """Tasks started since ``before`` that belong to the agent (not a pool's own workers)."""
    current = asyncio.current_task()
    out = set()
    for t in asyncio.all_tasks() - before:
        if t is current or t.done():
            continue
        coro = t.get_coro()
        code = getattr(coro, "cr_code", None)
        if code is not None and "psycopg_pool" in code.co_filename:
            continue
        if getattr(coro, "__qualname__", "") == "Event.wait":
            continue  # a timed wait inside a pool's scheduler (asyncio.wait_for's own task), not work
        out.add(t)
    return out


async def quiet(before: set) -> None:
    """Wait (at most :data:`QUIET_CAP_S`) for the work the agent left running (tasks started since ``before``),
    so that the checker reads an end state, not a moment of it."""
    left = leftover_tasks(before)
    if left:
        await asyncio.wait(left, timeout=QUIET_CAP_S)
