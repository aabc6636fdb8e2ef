"""The failure lab's episode runner: one scenario, one preset, one fault, checked at the end.

An episode here runs in an :class:`agentlab.lab.process.AgentProcess`: what one agent process holds (a business pool, a
checkpointer pool with its saver, compiled graphs). A fault may kill that process (an
:class:`agentlab.core.errors.SimulatedCrash` raised where a process would die); the episode then resumes
from its checkpoint in *another* process, with its own pools, saver, graph, tools node and model
instance, as after a real restart. Nothing of the crashed process's memory survives into the resume:
the model's state comes from the message history, the node's from the database.

Two things make many concurrent episodes cheap on one database:

- compiling a graph and binding the tool schemas cost about 4 ms, so a process compiles one graph
  per preset and routes each thread to its episode's own model and tools node (whose hooks a fault
  may use): the process keeps them by ``thread_id``;
- checkpoints are written once at the end of a run (LangGraph ``durability="exit"``) unless the fault
  resumes from a checkpoint mid-run, which needs one per super-step (``"sync"``).

A crashed process's saver drops every later write for the crashed thread (:class:`agentlab.lab.process.
CrashableSaver`): a dead process writes nothing, not even the error record LangGraph would store for a failed task.

The process (``AgentProcess``, ``CrashableSaver``, ``PoolPair``) lives in :mod:`agentlab.lab.process`, its
names still importable from here; this module holds the run: :class:`RunAccess`, :class:`EpisodeRun`,
:class:`FaultRun` and :class:`Lab`.

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

from psycopg_pool import PoolTimeout

from agentlab.core.batch import TransactionalToolsNode
from agentlab.core.graph import run_config
from agentlab.core.outbox import OutboxWorker
from agentlab.core.safeguards import Safeguards, preset
from agentlab.lab import loop
from agentlab.lab.checker import episode_checker
from agentlab.lab.clients.kit import KitClient
from agentlab.lab.invariants import Violation
from agentlab.lab.loop import RunAccess
from agentlab.lab.process import AgentProcess, CrashableSaver, PoolPair
from agentlab.lab.workloads import scenarios
from agentlab.runtime.harness import Episode, Harness
from agentlab.runtime.models import prompt_for_model
from agentlab.sim.model import ScriptedChatModel

# the agent process has a home of its own (issue 26); its names stay importable from here
__all__ = ["AgentProcess", "CrashableSaver", "EpisodeRun", "FaultRun", "Lab", "PoolPair", "RunAccess", "run_fault"]


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
    scenario: Any  # the harness's domain's scenario, prepared by the fault
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
    scenario: Any  # the harness's domain's scenario, prepared by the fault
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

    async def start(self) -> Lab:
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

    async def __aenter__(self) -> Lab:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _new_process(self, pool_max: int) -> AgentProcess:
        h = self.harness
        try:
            return await AgentProcess(h.url, provider=h.provider, events=h.events, toolset=h.toolset, pool_max=pool_max,
                                      checkpointer_max=self.checkpointer_max, error_hints=h.domain.error_hints,
                                      agent_login_refused=h.agent_login_refused).open()
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

    async def run(self, fault, safeguards: Safeguards | str = "full", *, scenario: Any = None,
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
        from agentlab.lab.faults import get_fault

        await self.start()
        make_model = model or (lambda script, seed: ScriptedChatModel(script=script, seed=seed))
        fault = get_fault(fault, self.harness.domain) if isinstance(fault, str) else fault
        sg = fault.episode_safeguards(preset(safeguards) if isinstance(safeguards, str) else safeguards)
        await self.install(fault)
        domain = self.harness.domain
        scenario, rng = scenarios.choose(self.harness, fault, seed=seed, scenario=scenario)
        if getattr(fault, "conversations", 1) > 1:  # two conversations at once (agentlab.lab.concurrency)
            from agentlab.lab.concurrency import run_concurrent

            ep, end_state, notes, violations = await run_concurrent(self, fault, sg, scenario=scenario, seed=seed,
                                                                     rng=rng, check=check, model=model)
            return FaultRun(fault.name, sg.name, end_state, sg, ep, False, False, notes, violations, "exit")
        sc = scenarios.prepared(self.harness, fault, scenario, rng)
        durability = durability or fault.forced_durability or ("sync" if fault.resumes_graph(sg) else "exit")
        h, process = self.harness, self.process
        t0 = time.perf_counter()
        thread_id = f"{fault.name}-{sg.name}-{uuid.uuid4().hex[:12]}"
        async with process.pool.connection() as conn:
            ids = await domain.create_rows(conn, sc, sg.schema)
        worker = OutboxWorker(process.pool, h.provider, thread_id=thread_id)
        run = EpisodeRun(h, process, fault, sg, sc, seed, thread_id, ids, process.node(sg), worker, rng)
        ep = Episode(sc.name, sg.name, thread_id, seed, ids, sg.schema, sc.tenant_id)
        script = sc.script(ids)
        episode_model = make_model(script, seed)
        prompt = sc.prompt if isinstance(episode_model, ScriptedChatModel) else prompt_for_model(sc, ids)
        client = KitClient(self, run, ep, model=episode_model, script=script, durability=durability,
                           config=run_config(thread_id, tenant_id=sc.tenant_id), make_model=make_model)
        checker = episode_checker(h.pool, sc, sg, domain) if check else None
        ep, violations = await loop.run(client, scenarios.workload(sc, prompt), fault, checker)
        ep.wall_ms = (time.perf_counter() - t0) * 1000
        return FaultRun(fault.name, sg.name, sc, sg, ep, run.crashed, run.worker_crashed, run.notes, violations,
                        durability)


async def run_fault(harness: Harness, fault, safeguards: Safeguards | str = "full", **kwargs) -> FaultRun:
    """Run and check one episode under ``fault`` on ``harness`` (see :meth:`Lab.run` for the arguments)."""
    async with Lab(harness) as lab:
        return await lab.run(fault, safeguards, **kwargs)
