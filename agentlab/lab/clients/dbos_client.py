"""The DBOS agent as a client of the lab's one loop (:func:`agentlab.lab.loop.run`): ``Yardstick.run("dbos:steps",
...)`` plays it beside the LangGraph agents, under the same faults and the same checker.

Each life is a child process (:class:`agentlab.lab.clients.dbos_agent.DbosAgent`): the first starts the
workflow, and after a death the next one's ``DBOS.launch()`` recovers it; there is no prompt to send again, DBOS
resumes by itself. DBOS's own verdict (``SUCCESS``, ``ERROR``, ``PENDING`` at the time cap) is kept in
``run.notes["engine"]`` beside the violations, with the lives' exit statuses and the versions measured.
"""

from __future__ import annotations

import shutil
import tempfile

from agentlab.core.errors import AgentlabError, SimulatedCrash
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.clients.dbos_agent import APP_MODULE, CAP_S, CRASH_STATEMENT, DbosAgent, SystemDatabase, versions
from agentlab.runtime.harness import Episode


class EngineStillRunning(AgentlabError):
    """The time cap ended the agent's process while DBOS still had the workflow PENDING."""


class DbosClient:
    """One episode of the DBOS agent of ``shape`` (``"transactions"`` or ``"steps"``). ``run`` is the
    :class:`agentlab.lab.clients.agent_process.AgentRun` (its ``thread_id`` is the workflow's id); ``script``
    the scripted model's batches with the agent's tool names; ``crash`` arms the crash hook in each life
    (``crash_inside_step``: the death flag decides which life dies); ``cap_s`` bounds each life in seconds; ``app`` is the module each
    life runs (:data:`agentlab.lab.clients.dbos_agent.APP_MODULE`, or Pydantic AI's on DBOS); ``measured``
    names the distributions whose versions are printed beside DBOS's."""

    def __init__(self, spec, run, *, shape: str, script: list, crash: bool, cap_s: float = CAP_S,
                 app: str = APP_MODULE, measured: tuple[str, ...] = ()):
        self.app, self.measured = app, measured
        self.spec, self.run, self.shape, self.script = spec, run, shape, script
        self.crash_after = CRASH_STATEMENT if crash else None
        self.cap_s = cap_s
        self.system: SystemDatabase | None = None
        self.agent: DbosAgent | None = None
        self.workdir: str | None = None

    def arms_after_build(self, nemesis) -> bool:
        return False

    async def open(self) -> None:
        """DBOS's system database for the episode (created here, dropped by :meth:`close`)."""
        self.system = await SystemDatabase(self.run.harness.url).create()
        self.workdir = tempfile.mkdtemp(prefix="agentlab-dbos-")
        self.agent = DbosAgent(self.run.harness.url, self.system, self.run.thread_id, self.shape, self.workdir,
                               cap_s=self.cap_s, app=self.app)
        self.run.notes["engine"] = {"system_database": self.system.name, "versions": versions(*self.measured)}

    async def build(self) -> None:
        pass  # each life registers the workflow with DBOS itself

    async def invoke(self, prompt: str | None) -> dict:
        """One life: the first starts the workflow, a later one recovers it. Raises :class:`SimulatedCrash`
        when the nemesis killed it, :class:`EngineStillRunning` at the time cap, :class:`AgentlabError` when the
        process failed otherwise."""
        if prompt is not None:
            life = await self.agent.start(prompt, self.script, self.run.seed, crash_after=self.crash_after)
        else:
            life = await self.agent.recover(crash_after=self.crash_after)
        if life.crashed:
            self.run.notes.setdefault("crashes", []).append(f"DBOS process died (exit {life.returncode})")
            raise SimulatedCrash(f"the DBOS agent's process died (exit status {life.returncode})")
        if life.returncode is None:
            raise EngineStillRunning(f"the workflow was still running after {self.cap_s:g} s")
        if life.returncode != 0:
            raise AgentlabError(f"the DBOS agent's process exited with status {life.returncode}: "
                                f"{life.output_tail.strip().splitlines()[-1:] or ''}")
        return await self.state()

    def describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.run.raised = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        pass  # a life ends when its workflow does

    async def recover(self, nemesis) -> None:
        pass  # the next life's DBOS.launch() recovers the workflow

    async def resubmit(self) -> None:
        pass  # never asked: DBOS recovers the workflow, no prompt is sent again

    async def state(self) -> dict:
        return {"messages": await self.agent.messages()}

    async def new_worker(self) -> OutboxWorker:
        r = self.run
        return OutboxWorker(r.harness.pool, r.harness.provider, thread_id=r.thread_id)

    async def flush(self) -> None:
        await self.run.harness.events.flush()

    async def close(self) -> None:
        """DBOS's verdict read, then its system database dropped and the lives' files removed."""
        try:
            if self.agent is not None:
                engine = self.run.notes["engine"]
                engine.update(await self.agent.verdict())
                engine["lives"] = [(life.mode, life.returncode, round(life.wall_s, 2)) for life in self.agent.lives]
                if engine["status"] not in ("SUCCESS", "NOT STARTED") and self.run.raised is None:
                    self.run.raised = f"DBOS {engine['status']}"
        finally:
            if self.system is not None:
                await self.system.drop()
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        r, sc = self.run, self.run.scenario
        r.messages = list(state.get("messages", []))
        return Episode(sc.name, self.spec.name, r.thread_id, r.seed, r.customer_ids, r.safeguards.schema,
                       sc.tenant_id, messages=r.messages)
