"""The failure lab's episode runner: one scenario, one preset, one fault, checked at the end.

An episode here runs in an :class:`AgentProcess`: what one agent process holds (a business pool, a
checkpointer pool with its saver, compiled graphs). A fault may kill that process (an
:class:`agentlab.core.errors.SimulatedCrash` raised where a process would die); the episode then resumes
from its checkpoint in *another* process, with its own pools, saver, graph, tools node and model
instance, as after a real restart. Nothing of the crashed process's memory survives into the resume:
the model's state comes from the message history, the node's from the database.

Two things make many concurrent episodes cheap on one database:

- compiling a graph and binding the tool schemas cost about 4 ms, so a process compiles one graph
  per preset and routes each thread to its episode's own model and tools node (whose hooks a fault
  may use): :class:`AgentProcess` keeps them by ``thread_id``;
- checkpoints are written once at the end of a run (LangGraph ``durability="exit"``) unless the fault
  resumes from a checkpoint mid-run, which needs one per super-step (``"sync"``).

A crashed process's saver drops every later write for the crashed thread (:class:`CrashableSaver`):
a dead process writes nothing, not even the error record LangGraph would store for a failed task.

``await Lab(harness).run("crash_before_checkpoint", "savepoints")`` runs and checks one episode;
:func:`run_fault` does the same in one call on a harness.

Sources: LangGraph docs "Persistence" (durability modes, resuming a thread with ``None`` input);
PostgreSQL "pg_terminate_backend"; psycopg_pool "Connection pools".
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import Runnable, ensure_config
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.errors import EmptyInputError
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from agentlab.core.errors import SimulatedCrash
from agentlab.core.graph import RETRY_ATTEMPTS, build_graph, run_config
from agentlab.runtime.harness import POOL_TIMEOUT_S, Episode, Harness, checkpointer_pool
from agentlab.runtime.models import prompt_for_model
from agentlab.lab.invariants import Violation, check_episode
from agentlab.sim.model import ScriptedChatModel
from agentlab.core.tools_node import TransactionalToolsNode
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.core.safeguards import Safeguards, preset
from agentlab.domains.billing.scenarios import Scenario


class CrashableSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` whose writes for a thread stop once that thread's process has crashed.

    :meth:`kill` marks a thread dead in this saver (this process); later ``aput`` / ``aput_writes``
    for it write nothing, as nothing is written by a process that has died.
    """

    def __init__(self, conn, **kwargs):
        super().__init__(conn, **kwargs)
        self.dead_threads: set[str] = set()

    def kill(self, thread_id: str) -> None:
        self.dead_threads.add(thread_id)

    async def aput(self, config, checkpoint, metadata, new_versions):
        conf = config["configurable"]
        if conf["thread_id"] in self.dead_threads:
            return {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        if config["configurable"]["thread_id"] in self.dead_threads:
            return None
        return await super().aput_writes(config, writes, task_id, task_path)


class _ModelRouter(Runnable):
    """The graph's model: forwards each call to the scripted model registered for the run's thread.

    A :class:`ScriptedChatModel` is called through its ``_agenerate`` directly: LangChain's generic layer
    around a chat model (callbacks, cache, rate limiter, run ids) costs about 2 ms per episode and
    changes nothing the lab measures; any other model goes through ``ainvoke`` as usual.
    """

    def __init__(self, models: dict[str, Any]):
        self.models = models
        self.tools: list = []

    def bind_tools(self, tools, **kwargs) -> "_ModelRouter":
        self.tools = tools  # the scripted models play their script; another model gets them bound per call
        return self

    def _model(self, config) -> Any:
        thread_id = ensure_config(config).get("configurable", {}).get("thread_id")
        try:
            return self.models[thread_id]
        except KeyError:
            raise LookupError(f"no model is registered for thread {thread_id!r} in this process") from None

    def invoke(self, input, config=None, **kwargs):
        return self._model(config).invoke(input)

    async def ainvoke(self, input, config=None, **kwargs):
        model = self._model(config)
        if isinstance(model, ScriptedChatModel):
            return (await model._agenerate(list(input))).generations[0].message
        # a real model: the tools bound, the node's callbacks (streamed arguments) along
        return await model.bind_tools(self.tools).ainvoke(input, config)


class _NodeRouter(TransactionalToolsNode):
    """The graph's tools node: runs each batch on the node registered for the batch's thread."""

    def __init__(self, *args, nodes: dict[str, TransactionalToolsNode], **kwargs):
        super().__init__(*args, **kwargs)
        self.nodes = nodes

    async def run_batch(self, tool_calls, *, thread_id: str, **kwargs):
        node = self.nodes.get(thread_id)
        if node is None:
            return await super().run_batch(tool_calls, thread_id=thread_id, **kwargs)
        return await node.run_batch(tool_calls, thread_id=thread_id, **kwargs)


class PoolPair:
    """A process's two pools: ``pool`` for the tools and ``checkpointer_pool`` for its saver."""

    async def open_pools(self) -> None:
        """Open both pools (waiting for their first connections); on failure or cancellation close
        whichever opened, so no pool keeps reconnecting in the background."""
        try:
            await self.pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            await self.checkpointer_pool.open(wait=True, timeout=POOL_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self.checkpointer_pool.close()
        await self.pool.close()


class AgentProcess(PoolPair):
    """What one agent process holds: pools, a checkpointer and compiled graphs, on one database.

    Args:
        url: conninfo of the database.
        provider: the payment provider (the outside world: shared by every process).
        events: where events go.
        toolset: the domain's tools.
        error_hints: the domain's texts for its own constraints (``domain.error_hints``).
        pool_max / checkpointer_max: pool sizes (connections).
    """

    def __init__(self, url: str, *, provider, events, toolset, pool_max: int = 8, checkpointer_max: int = 4,
                 error_hints=None):
        self.url = url
        self.toolset = toolset
        self.error_hints = error_hints
        self.provider = provider
        self.events = events
        self.pool = AsyncConnectionPool(url, min_size=1, max_size=pool_max, kwargs={"autocommit": True}, open=False)
        self.checkpointer_pool = checkpointer_pool(url, max_size=checkpointer_max)
        self.saver: CrashableSaver | None = None
        self._models: dict[str, Any] = {}
        self._nodes: dict[str, TransactionalToolsNode] = {}
        self._graphs: dict[Safeguards, Any] = {}

    async def open(self) -> "AgentProcess":
        """Open both pools (:meth:`PoolPair.open_pools`) and the process's saver."""
        await self.open_pools()
        self.saver = CrashableSaver(self.checkpointer_pool)
        return self

    def node(self, safeguards: Safeguards) -> TransactionalToolsNode:
        """A fresh tools node on this process's pool (its hooks are the episode's own)."""
        node = TransactionalToolsNode(self.pool, safeguards, toolset=self.toolset, provider=self.provider, events=self.events,
                                      max_attempts=RETRY_ATTEMPTS, error_hints=self.error_hints)
        return node

    def graph(self, safeguards: Safeguards):
        """The compiled graph for ``safeguards`` (one per preset per process), with this process's saver."""
        graph = self._graphs.get(safeguards)
        if graph is None:
            router = _NodeRouter(self.pool, safeguards, toolset=self.toolset, provider=self.provider, events=self.events, nodes=self._nodes,
                                 error_hints=self.error_hints)
            graph = build_graph(_ModelRouter(self._models), router, checkpointer=self.saver)
            self._graphs[safeguards] = graph
        return graph

    def register(self, thread_id: str, model, node: TransactionalToolsNode) -> None:
        self._models[thread_id] = model
        self._nodes[thread_id] = node

    def release(self, thread_id: str) -> None:
        self._models.pop(thread_id, None)
        self._nodes.pop(thread_id, None)


class RunAccess:
    """What a fault reaches through one episode's run, whichever runner made it (:class:`EpisodeRun`, the
    yardstick's ``AgentRun``): the harness's pool and provider, the preset's schema, and a process crash.
    A subclass has ``harness``, ``safeguards``, ``thread_id`` and ``notes``, and names its saver in
    :meth:`episode_saver`."""

    def episode_saver(self) -> CrashableSaver:
        raise NotImplementedError

    @property
    def pool(self):
        return self.harness.pool

    @property
    def provider(self):
        return self.harness.provider

    @property
    def schema(self) -> str:
        return self.safeguards.schema

    def crash(self, where: str) -> SimulatedCrash:
        """The process dies here: its saver writes nothing more for this thread. Raise the result."""
        self.episode_saver().kill(self.thread_id)
        self.notes.setdefault("crashes", []).append(where)
        return SimulatedCrash(f"simulated process crash {where} (thread {self.thread_id})")


@dataclass
class EpisodeRun(RunAccess):
    """One episode in progress: what a fault may act on.

    ``pool`` is the harness's pool, for "another session" (a lock holder, a killer, a fault's
    controller); ``node`` and ``worker`` are the episode's own, so hooks on them touch no other
    episode. ``notes`` records what the fault did, for tests and curious readers.
    """

    harness: Harness
    process: AgentProcess
    fault: Any
    safeguards: Safeguards
    scenario: Scenario
    seed: int
    thread_id: str
    customer_ids: list[int]
    node: TransactionalToolsNode
    worker: OutboxWorker
    rng: random.Random
    crashed: bool = False
    worker_crashed: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    background: list = field(default_factory=list)

    def episode_saver(self) -> CrashableSaver:
        return self.process.saver


@dataclass
class FaultRun:
    """One checked episode: the episode, the prepared scenario, what the fault did, the violations."""

    fault: str
    preset: str
    scenario: Scenario
    safeguards: Safeguards
    episode: Episode
    crashed: bool
    worker_crashed: bool
    notes: dict[str, Any]
    violations: list[Violation]
    durability: str

    @property
    def ok(self) -> bool:
        return not self.violations


class Lab:
    """Runs episodes under faults on one harness's database.

    Episodes run in :attr:`process`; a crashed episode resumes in :attr:`restarted`, a second process
    opened on first need. Both are closed by :meth:`close` (the harness is not).

    Args:
        harness: the database, provider and events.
        pool_max: business connections of the main process (at least the number of concurrent episodes).
        checkpointer_max: checkpointer connections per process.
    """

    def __init__(self, harness: Harness, *, pool_max: int = 8, checkpointer_max: int = 4):
        self.harness = harness
        self.pool_max = pool_max
        self.checkpointer_max = checkpointer_max
        self.process: AgentProcess | None = None
        self.restarted: AgentProcess | None = None
        self._installed: set[str] = set()
        self._opening = asyncio.Lock()  # episodes crash concurrently: open each process once

    async def start(self) -> "Lab":
        """Open the agent process. Raises :class:`agentlab.runtime.harness.HarnessClosed` at once if the
        harness was closed (its pools are closed; its database was dropped)."""
        self.harness.check_open()
        async with self._opening:
            if self.process is None:
                self.process = await self._new_process(self.pool_max)
        return self

    async def close(self) -> None:
        for p in (self.restarted, self.process):
            if p is not None:
                await p.close()
        self.process = self.restarted = None
        await self.harness.events.flush()

    async def __aenter__(self) -> "Lab":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _new_process(self, pool_max: int) -> AgentProcess:
        h = self.harness
        try:
            return await AgentProcess(h.url, provider=h.provider, events=h.events, toolset=h.toolset, pool_max=pool_max,
                                      checkpointer_max=self.checkpointer_max, error_hints=h.domain.error_hints).open()
        except PoolTimeout as exc:
            await h.ensure_reachable(exc)  # the server is gone: DatabaseUnavailable, else the timeout
            raise

    async def restart_process(self) -> AgentProcess:
        """The process crashed episodes resume in (new pools, saver and graphs; opened once)."""
        async with self._opening:
            if self.restarted is None:
                self.restarted = await self._new_process(max(4, self.pool_max // 4))
        return self.restarted

    async def install(self, fault) -> None:
        """Database objects a fault needs (once per database, before episodes run concurrently)."""
        if fault.name not in self._installed:
            async with self._opening:
                if fault.name not in self._installed:
                    await fault.install(self.harness.pool)
                    self._installed.add(fault.name)

    async def run(self, fault, safeguards: Safeguards | str = "full", *, scenario: Scenario | str | None = None,
                  seed: int = 0, durability: str | None = None, check: bool = True, model=None) -> FaultRun:
        """Run one episode of ``scenario`` (default: one the fault fits, chosen by ``seed``) under
        ``safeguards`` with ``fault`` injected; drain its outbox; check the invariants.

        Args:
            fault: a :class:`agentlab.lab.faults.Fault` or its name.
            safeguards: a preset name or value; the episode runs under ``fault.episode_safeguards(safeguards)``
                (the statement-timeout fault scales the statement timeout down to the lab's scale).
            durability: LangGraph durability; default the fault's own (``forced_durability``), else
                ``"sync"`` when the fault may resume the graph from a checkpoint, else ``"exit"``.
            check: run the invariant checker (else ``violations`` is empty).
            model: ``model(script, seed)`` builds the episode's chat model from the resolved script (default
                :class:`agentlab.sim.model.ScriptedChatModel`); called again for the resumed process.

        A fault of two conversations (``fault.conversations == 2``, :mod:`agentlab.lab.concurrency`) runs both
        at once (:func:`agentlab.lab.concurrency.run_concurrent`), each run holding its thread's lease under
        ``safeguards.run_lock``; a one-conversation episode has no second run to refuse and takes none.
        """
        from agentlab.lab.faults import fault_scenarios, get_fault

        await self.start()
        make_model = model or (lambda script, seed: ScriptedChatModel(script=script, seed=seed))
        fault = get_fault(fault) if isinstance(fault, str) else fault
        sg = fault.episode_safeguards(preset(safeguards) if isinstance(safeguards, str) else safeguards)
        await self.install(fault)
        rng = random.Random(f"{seed}:{fault.name}")
        domain = self.harness.domain
        if scenario is None:
            scenario = rng.choice(fault_scenarios(fault, domain))
        if getattr(fault, "conversations", 1) > 1:  # two conversations at once (agentlab.lab.concurrency)
            from agentlab.lab.concurrency import run_concurrent

            ep, end_state, notes, violations = await run_concurrent(self, fault, sg, scenario=scenario, seed=seed,
                                                                     rng=rng, check=check, model=model)
            return FaultRun(fault.name, sg.name, end_state, sg, ep, False, False, notes, violations, "exit")
        base = self.harness.scenario(scenario)
        sc = fault.prepare(base.clean(), rng)
        durability = durability or fault.forced_durability or ("sync" if fault.resumes_graph(sg) else "exit")
        h, process = self.harness, self.process
        t0 = time.perf_counter()
        thread_id = f"{fault.name}-{sg.name}-{uuid.uuid4().hex[:12]}"
        async with process.pool.connection() as conn:
            ids = await domain.create_rows(conn, sc, sg.schema)
        node = process.node(sg)
        worker = OutboxWorker(process.pool, h.provider, thread_id=thread_id)
        run = EpisodeRun(h, process, fault, sg, sc, seed, thread_id, ids, node, worker, rng)
        ep = Episode(sc.name, sg.name, thread_id, seed, ids, sg.schema, sc.tenant_id)
        config = run_config(thread_id, tenant_id=sc.tenant_id)
        episode_model = make_model(sc.script(ids), seed)
        prompt = sc.prompt if isinstance(episode_model, ScriptedChatModel) else prompt_for_model(sc, ids)
        process.register(thread_id, episode_model, node)
        active, state = process, None
        try:
            await fault.arm(run)
            try:
                state = await process.graph(sg).ainvoke({"messages": [HumanMessage(prompt)]}, config,
                                                        durability=durability)
            except SimulatedCrash:
                run.crashed = True
            except Exception as exc:
                ep.error = f"{type(exc).__name__}: {exc}"
            if run.crashed:
                await fault.before_restart(run)
                active = await self.restart_process()
                active.register(thread_id, make_model(sc.script(ids), seed), active.node(sg))
                try:
                    try:
                        state = await active.graph(sg).ainvoke(None, config, durability=durability)
                    except EmptyInputError:  # no checkpoint (durability "exit"): nothing to resume
                        if not fault.resubmits:
                            raise
                        # the user sends the prompt again; the model's tool call ids are new (case C23)
                        run.notes["resume"] = "no checkpoint; the prompt was sent again"
                        active.register(thread_id, make_model(sc.script(ids), seed + 1), active.node(sg))
                        state = await active.graph(sg).ainvoke({"messages": [HumanMessage(prompt)]}, config,
                                                               durability=durability)
                except Exception as exc:
                    ep.error = f"{type(exc).__name__}: {exc}"
                    state = None
            if state is None:
                snapshot = await active.graph(sg).aget_state(config)
                state = snapshot.values if snapshot is not None else {}
            if sg.outbox:  # without the outbox no tool writes an outbox row: nothing to drain
                ep.drain = await self._drain(run, active)
        finally:
            await fault.disarm(run)
            process.release(thread_id)
            if active is not process:
                active.release(thread_id)
        ep.messages = list(state.get("messages", []))
        ep.rollbacks_total = state.get("rollbacks_total", 0)
        ep.escalated = bool(state.get("escalated", False))
        violations = await check_episode(h.pool, ep, sc, sg, domain) if check else []
        ep.wall_ms = (time.perf_counter() - t0) * 1000
        return FaultRun(fault.name, sg.name, sc, sg, ep, run.crashed, run.worker_crashed, run.notes, violations,
                        durability)

    async def _drain(self, run: EpisodeRun, active: AgentProcess) -> DrainStats:
        try:
            return await run.worker.drain()
        except SimulatedCrash:
            # the worker died after the provider call; a new worker in the restarted process drains again
            run.worker_crashed = True
            await run.fault.before_restart(run)
            restarted = await self.restart_process()
            return await OutboxWorker(restarted.pool, self.harness.provider, thread_id=run.thread_id).drain()


async def run_fault(harness: Harness, fault, safeguards: Safeguards | str = "full", **kwargs) -> FaultRun:
    """Run and check one episode under ``fault`` on ``harness`` (see :meth:`Lab.run` for the arguments)."""
    async with Lab(harness) as lab:
        return await lab.run(fault, safeguards, **kwargs)
