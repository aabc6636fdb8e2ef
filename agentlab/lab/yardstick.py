"""The yardstick: the failure lab run against any LangGraph agent, side by side with the kit.

An agent (:class:`agentlab.lab.agents.AgentSpec`: the prebuilt ``ToolNode`` graph, LangChain's
``create_agent``, the kit under a preset, or your own factory) plays a domain's scenario on the
domain's schema and seed data, driven by the scripted model (or any chat model), under one fault;
the domain's and the generic invariants then read the database, the provider and the message
history. Every fault here needs no hook inside the agent's code:

===========================  ===========================================================================
fault                        mechanism, the same for every agent
===========================  ===========================================================================
hallucinations, constraints  the scripted model sends the bad arguments (the catalog's ``prepare``)
``lock_timeout``             a second session holds the customer's row lock (the catalog's)
``statement_timeout``        a trigger keeps the customer's UPDATE running (the catalog's)
``backend_killed``           a trigger marks the customer's UPDATE in ``pg_locks``; another real
                             connection runs ``pg_terminate_backend`` on that backend, mid-statement
``crash_before_checkpoint``  the checkpointer: the process dies when the tools step's ToolMessages
                             reach the saver, before they are written; a new process resumes the thread
``provider_timeout``         the fake provider performs the payment, then the request times out
``worker_crash``             the process calling the provider dies after the provider answered (the
                             provider handed to the agent; with the kit's outbox, the outbox worker)
``crash_mid_node``           needs a hook inside the tools step: only agents exposing ``node_hooks``
the concurrency family       two runs of the agent's graph at once on one customer (one thread, or two),
                             a barrier on the connections of the pool the agent is handed
                             (:mod:`agentlab.lab.yardstick_concurrency`)
===========================  ===========================================================================

A fault that cannot apply to an agent (a hook it does not expose, a hallucination a real model would
not make on cue) gives the cell ``n/a`` with the reason, never a pass.
:data:`agentlab.lab.yardstick_faults.YARDSTICK_FAULTS` is the registry;
:func:`agentlab.lab.yardstick_faults.register_fault` adds a fault (a family built elsewhere plugs in there).

Episodes run one at a time, each agent process with its own pools and saver, and the episode ends
only when the work the agent left running (a ``ToolNode`` sibling still in flight when another call
raised) has finished: so the same seed gives the same table.

``await Yardstick(harness).run("toolnode", "backend_killed")`` runs one episode;
``await run_yardstick(["toolnode", "create_agent", "kit"])`` (:mod:`agentlab.lab.yardstick_table`) the table;
``python -m agentlab chaos --agent toolnode create_agent kit`` prints it.

Sources: LangGraph docs "Persistence" (resuming a thread with ``None``), "ToolNode" (its error
handling); LangChain docs "Agents" (``create_agent``); PostgreSQL "pg_terminate_backend", "pg_locks".
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import ToolMessage
from psycopg_pool import AsyncConnectionPool, AsyncNullConnectionPool

from agentlab.core import budget
from agentlab.core.errors import SimulatedCrash
from agentlab.core.outbox import OutboxWorker
from agentlab.lab import loop
from agentlab.lab.agents import (  # as_domain_messages, describe_raised: importable from here as before
    AgentContext,
    AgentSpec,
    as_domain_messages,  # noqa: F401
    describe_raised,  # noqa: F401
    rename_script,
    resolve_agent,
)
from agentlab.lab.checker import episode_checker
from agentlab.lab.clients.graph_agent import GraphAgentClient
from agentlab.lab.faults import Concurrent
from agentlab.lab.invariants import KINDS
from agentlab.lab.process import CrashableSaver, PoolPair
from agentlab.lab.runner import RunAccess
from agentlab.lab.wire import NetworkProvider, Wire, WiredConnection
from agentlab.lab.workloads import scenarios
from agentlab.lab.yardstick_faults import NA, YardstickFault, get_yardstick_fault
from agentlab.runtime.harness import Harness, checkpointer_pool
from agentlab.runtime.models import prompt_for_model
from agentlab.sim.model import ScriptedChatModel

QUIET_CAP_S = 5.0  # how long an episode waits for the work its agent left running


# --------------------------------------------------------------------------- one agent process

class YardstickSaver(CrashableSaver):
    """The real ``AsyncPostgresSaver`` (via :class:`agentlab.lab.process.CrashableSaver`), where the
    process can die on the way in: once a thread in :attr:`crash_at_tool_writes` hands it writes that
    carry ToolMessages, the thread is dead in this process (nothing more is written for it) and
    :class:`SimulatedCrash` is raised."""

    def __init__(self, conn, **kwargs):
        super().__init__(conn, **kwargs)
        self.crash_at_tool_writes: set[str] = set()
        self.crashed_here: set[str] = set()

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        thread_id = config["configurable"]["thread_id"]
        if thread_id in self.crash_at_tool_writes and any(_has_tool_message(v) for _, v in writes):
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
        return await super().aput(config, checkpoint, metadata, new_versions)

    def _crash(self, thread_id: str) -> SimulatedCrash:
        return SimulatedCrash(f"simulated process crash after the tools step, before its checkpoint (thread {thread_id})")


def _has_tool_message(value: Any) -> bool:
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


# --------------------------------------------------------------------------- one episode

@dataclass
class AgentRun(RunAccess):
    """One episode of one agent under one fault: what a fault acts on while it runs, and the outcome.

    ``pool`` is the harness's (another session: the lock holder, the killer); ``saver``, ``node`` and
    ``worker`` are the episode's own. ``raised`` names what the agent's run raised (``None``: it ended).
    ``status`` is ``"ran"`` or ``"n/a"`` (``reason`` says why)."""

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

    def episode_saver(self):
        return self.saver

    def counts(self) -> dict[str, int]:
        """Violations by kind (every kind of :data:`agentlab.lab.invariants.KINDS`, then a domain's own)."""
        c = Counter(v.kind for v in self.violations)
        return {**{k: c.get(k, 0) for k in KINDS}, **{k: n for k, n in c.items() if k not in KINDS}}


def _leftover_tasks(before: set) -> set:
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


class Yardstick:
    """Runs agents under faults on one harness's database (its domain, schema and seed data).

    Args:
        harness: the database, the provider and the events (:class:`agentlab.runtime.harness.Harness`).
        model: ``model(script, seed)`` builds the episode's chat model (default: the scripted model);
            a real model (``model=lambda script, seed: load_model("openai:gpt-4o-mini")``) makes the
            scripted hallucinations ``n/a``.
    """

    def __init__(self, harness: Harness, *, model: Callable[[list, int], Any] | None = None):
        self.harness = harness
        self.make_model = model or (lambda script, seed: ScriptedChatModel(script=script, seed=seed))
        self.scripted = model is None
        self._installed: set[str] = set()

    async def run(self, agent, fault: str | YardstickFault = "none", *, seed: int = 0,
                  scenario: str | None = None) -> AgentRun:
        """One episode of ``agent`` (see :func:`agentlab.lab.agents.resolve_agent`) under ``fault``, checked.

        The scenario is the fault's, chosen by ``seed`` as the failure lab chooses it (so every agent
        plays the same episode for one seed). Returns the :class:`AgentRun` (``status`` ``"n/a"`` with
        its ``reason`` when the fault cannot apply to the agent).

        Raises:
            ValueError: an unknown fault or scenario.
            agentlab.core.errors.AgentlabError: an agent that does not load.
        """
        spec = resolve_agent(agent)
        yf = get_yardstick_fault(fault) if isinstance(fault, str) else fault
        h = self.harness
        h.check_open()
        name, rng = scenarios.choose(h, yf.fault, seed=seed, scenario=scenario, name=yf.name)
        sc = scenarios.prepared(h, yf.fault, name, rng)
        out = AgentRun(spec.name, yf.name, sc, seed, harness=h)
        why = yf.not_applicable(spec, scripted_model=self.scripted)
        if why is not None:
            out.status, out.reason = NA, why
            return out
        if yf.name not in self._installed:
            await yf.fault.install(h.pool)
            self._installed.add(yf.name)
        if isinstance(yf.fault, Concurrent):
            from agentlab.lab.yardstick_concurrency import run_two

            return await run_two(self, spec, yf.fault, out)
        sg = yf.fault.episode_safeguards(spec.checked_as) if spec.safeguards is not None else spec.checked_as
        out.safeguards, out.outbox = sg, sg.outbox
        out.thread_id = f"{spec.name.replace(':', '-')}-{yf.name}-{uuid.uuid4().hex[:12]}"
        async with h.pool.connection() as conn:
            out.customer_ids = await h.domain.create_rows(conn, sc, sg.schema)
        out.network_provider = NetworkProvider(h.provider)
        out.worker = OutboxWorker(h.pool, out.network_provider, thread_id=out.thread_id)
        script = rename_script(sc.script(out.customer_ids), dict(spec.tool_names))
        config = {"configurable": {"thread_id": out.thread_id, "tenant_id": sc.tenant_id}}
        if spec.safeguards is not None:
            from agentlab.core.graph import run_config

            config = run_config(out.thread_id, tenant_id=sc.tenant_id)
        durability = "sync" if yf.fault.resumes else "async"
        client = GraphAgentClient(self, spec, out, needs=yf.needs, script=script, config=config, durability=durability)
        _, out.violations = await loop.run(client, scenarios.workload(sc, self.prompt(sc, out.customer_ids)),
                                           yf.fault, episode_checker(h.pool, sc, sg, h.domain))
        return out

    def prompt(self, scenario, customer_ids: list[int]) -> str:
        """The user's message: the scenario's prompt; for a real model, followed by the ids the episode
        created (:func:`agentlab.runtime.models.prompt_for_model`), which a real model cannot guess."""
        return scenario.prompt if self.scripted else prompt_for_model(scenario, customer_ids)

    async def open_process(self, processes: list) -> EpisodeProcess:
        """A new agent process of the episode on the harness's database, appended to ``processes``."""
        p = await EpisodeProcess(self.harness.url).open()
        processes.append(p)
        return p

    def build(self, spec: AgentSpec, process: EpisodeProcess, script, seed: int, run: AgentRun, *, pool=None):
        """``spec``'s graph in ``process`` (on ``pool``, default the process's), its model playing ``script``;
        ``run.node`` is the tools step the build exposed (None when it exposes none)."""
        ctx = AgentContext(self.make_model(script, seed), pool or process.pool, run.agent_provider or run.network_provider,
                           process.saver, self.harness.domain, self.harness.events,
                           safeguards=run.safeguards if spec.safeguards is not None else None)
        graph = spec.build(ctx)
        run.node = ctx.exposed.get("node")
        return graph

    async def quiet(self, before: set) -> None:
        """Wait (at most :data:`QUIET_CAP_S`) for the work the agent left running, so that the checker
        reads an end state, not a moment of it."""
        left = _leftover_tasks(before)
        if left:
            await asyncio.wait(left, timeout=QUIET_CAP_S)
