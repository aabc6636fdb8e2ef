"""What every durable engine's client shares: each life a child process, the engine's verdict beside the violations.

A durable engine's agent (DBOS: :mod:`agentlab.lab.clients.dbos_client`; Temporal:
:mod:`agentlab.lab.clients.temporal_client`) runs each life in a child process (:func:`run_life`): the first
life starts the workflow; after a death the next one recovers it (DBOS's ``launch()``, a Temporal worker on the
same task queue), so there is no prompt to send again. :class:`EngineClient` is the part of the lab's client
protocol (:func:`agentlab.lab.loop.run`) that is the same for every engine: a death is a
:class:`agentlab.core.errors.SimulatedCrash`, the time cap is :class:`EngineStillRunning`, and the engine's own
verdict (its status, the lives' exit statuses and wall times) goes into ``run.notes["engine"]``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agentlab.core.errors import AgentlabError, SimulatedCrash
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.nemesis.death import EXIT_CODE
from agentlab.runtime.harness import Episode

ROOT = Path(__file__).resolve().parents[3]  # the directory holding the agentlab package
INSTALL_HINT = "pip install -r requirements-engines.txt"


class EngineStillRunning(AgentlabError):
    """The time cap ended the agent's process while the engine still had the workflow running."""


@dataclass
class EngineLife:
    """One child process: ``mode`` (``"start"`` or ``"recover"``), its exit code (``99``: the crash fault,
    :data:`agentlab.lab.nemesis.death.EXIT_CODE`; ``None``: ended by the lab at the time cap), its wall time in
    seconds, and the tail of its output."""

    mode: str
    returncode: int | None
    wall_s: float
    output_tail: str = ""

    @property
    def crashed(self) -> bool:
        return self.returncode == EXIT_CODE


async def run_life(module: str, mode: str, spec: Path, log: Path, cap_s: float) -> EngineLife:
    """Run ``python -m module mode spec`` (this interpreter, the agentlab package importable) until it exits or
    ``cap_s`` seconds pass (then it is killed: ``returncode`` None); its output goes to ``log``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", module, mode, str(spec),
                                                    stdout=out, stderr=out, env=env)
        try:
            code: int | None = await asyncio.wait_for(proc.wait(), cap_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            code = None
    return EngineLife(mode, code, time.perf_counter() - t0, log.read_text(errors="replace")[-2000:])


def package_versions(*names: str) -> dict[str, str]:
    """``{distribution: version}`` for ``names`` (``"-"`` where one is not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    return out


class EngineClient:
    """One episode of a durable engine's agent, as a client of the lab's one loop. A subclass sets ``engine``
    (the name printed: ``"DBOS"``), ``finished`` (the engine's statuses of a workflow that ended as it should, or
    never started: ``("SUCCESS", "NOT STARTED")``) and ``what_dies`` (``"the DBOS agent's process"``), and writes
    :meth:`open` (which sets ``self.agent``: a handle with ``start``, ``recover``, ``lives``, ``verdict`` and
    ``messages``), :meth:`start_life` and :meth:`recover_life`. ``run`` is the episode's
    :class:`agentlab.lab.clients.agent_process.AgentRun`; ``cap_s`` bounds each life in seconds."""

    engine = "engine"
    finished: tuple[str, ...] = ("NOT STARTED",)
    what_dies = "the engine's process"

    def __init__(self, spec, run, *, script: list, crash: bool, cap_s: float, route=None):
        self.spec, self.run, self.script, self.crash, self.cap_s = spec, run, script, crash, cap_s
        self.route = route  # route(conninfo) -> conninfo: how the agent's lives reach the database (None: directly)
        self.agent = None
        self.workdir: str | None = None

    async def start_life(self, prompt: str):
        raise NotImplementedError

    async def recover_life(self):
        raise NotImplementedError

    def arms_after_build(self, nemesis) -> bool:
        return False

    async def build(self) -> None:
        pass  # each life registers the workflow with its engine itself

    async def invoke(self, prompt: str | None) -> dict:
        """One life: the first (``prompt`` given) starts the workflow, a later one recovers it. Raises
        :class:`SimulatedCrash` when the nemesis killed it, :class:`EngineStillRunning` at the time cap,
        :class:`AgentlabError` when the process failed otherwise."""
        life = await (self.start_life(prompt) if prompt is not None else self.recover_life())
        if life.crashed:
            self.run.notes.setdefault("crashes", []).append(f"{self.engine} process died (exit {life.returncode})")
            raise SimulatedCrash(f"{self.what_dies} died (exit status {life.returncode})")
        if life.returncode is None:
            raise EngineStillRunning(f"the workflow was still running after {self.cap_s:g} s")
        if life.returncode != 0:
            raise AgentlabError(f"{self.what_dies} exited with status {life.returncode}: "
                                f"{life.output_tail.strip().splitlines()[-1:] or ''}")
        return await self.state()

    def describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.run.raised = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        pass  # a life ends when its workflow does

    async def recover(self, nemesis) -> None:
        pass  # the next life recovers the workflow

    async def resubmit(self) -> None:
        pass  # never asked: the engine recovers the workflow, no prompt is sent again

    async def state(self) -> dict:
        return {"messages": await self.agent.messages()}

    async def new_worker(self) -> OutboxWorker:
        r = self.run
        return OutboxWorker(r.harness.pool, r.harness.provider, thread_id=r.thread_id)

    async def flush(self) -> None:
        await self.run.harness.events.flush()

    async def read_verdict(self) -> None:
        """The engine's verdict into ``run.notes["engine"]`` (and ``run.raised`` when the workflow did not end as
        it should and nothing was raised)."""
        if self.agent is None:
            return
        engine = self.run.notes["engine"]
        engine.update(await self.agent.verdict())
        engine["lives"] = [(life.mode, life.returncode, round(life.wall_s, 2)) for life in self.agent.lives]
        if engine["status"] not in self.finished and self.run.raised is None:
            self.run.raised = f"{self.engine} {engine['status']}"

    async def after_verdict(self) -> None:
        """What an engine does once its verdict is read (nothing here)."""

    async def close(self) -> None:
        """The engine's verdict read (then :meth:`after_verdict`), then the lives' files removed."""
        try:
            await self.read_verdict()
            if self.agent is not None:
                await self.after_verdict()
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        r, sc = self.run, self.run.scenario
        r.messages = list(state.get("messages", []))
        return Episode(sc.name, self.spec.name, r.thread_id, r.seed, r.customer_ids, r.safeguards.schema,
                       sc.tenant_id, messages=r.messages)
