"""The DBOS agent as a client of the lab's one loop (:func:`agentlab.lab.loop.run`): ``Yardstick.run("dbos:steps",
...)`` plays it beside the LangGraph agents, under the same faults and the same checker.

Each life is a child process (:class:`agentlab.lab.clients.dbos_agent.DbosAgent`): the first starts the
workflow, and after a death the next one's ``DBOS.launch()`` recovers it; there is no prompt to send again, DBOS
resumes by itself. DBOS's own verdict (``SUCCESS``, ``ERROR``, ``PENDING`` at the time cap) is kept in
``run.notes["engine"]`` beside the violations, with the lives' exit statuses and the versions measured. What
every engine's client shares is :class:`agentlab.lab.clients.engine.EngineClient`.
"""

from __future__ import annotations

import tempfile

from agentlab.lab.clients.dbos_agent import APP_MODULE, CAP_S, CRASH_STATEMENT, DbosAgent, SystemDatabase, versions
from agentlab.lab.clients.engine import EngineClient, EngineStillRunning  # noqa: F401 (importable from here)


class DbosClient(EngineClient):
    """One episode of the DBOS agent of ``shape`` (``"transactions"`` or ``"steps"``). ``run`` is the
    :class:`agentlab.lab.clients.agent_process.AgentRun` (its ``thread_id`` is the workflow's id); ``script``
    the scripted model's batches with the agent's tool names; ``crash`` arms the crash hook in each life
    (``crash_inside_step``: the death flag decides which life dies); ``cap_s`` bounds each life in seconds; ``app``
    is the module each life runs (:data:`agentlab.lab.clients.dbos_agent.APP_MODULE`, or Pydantic AI's on DBOS);
    ``measured`` names the distributions whose versions are printed beside DBOS's."""

    engine, finished, what_dies = "DBOS", ("SUCCESS", "NOT STARTED"), "the DBOS agent's process"

    def __init__(self, spec, run, *, shape: str, script: list, crash: bool, cap_s: float = CAP_S,
                 app: str = APP_MODULE, measured: tuple[str, ...] = (), route=None):
        super().__init__(spec, run, script=script, crash=crash, cap_s=cap_s, route=route)
        self.app, self.measured, self.shape = app, measured, shape
        self.crash_after = CRASH_STATEMENT if crash else None
        self.system: SystemDatabase | None = None

    async def open(self) -> None:
        """DBOS's system database for the episode (created here, dropped by :meth:`close`)."""
        self.system = await SystemDatabase(self.run.harness.url).create()
        self.workdir = tempfile.mkdtemp(prefix="agentlab-dbos-")
        self.agent = DbosAgent(self.run.harness.url, self.system, self.run.thread_id, self.shape, self.workdir,
                               cap_s=self.cap_s, app=self.app, route=self.route)
        self.run.notes["engine"] = {"system_database": self.system.name, "versions": versions(*self.measured)}

    async def start_life(self, prompt: str):
        return await self.agent.start(prompt, self.script, self.run.seed, crash_after=self.crash_after)

    async def recover_life(self):
        return await self.agent.recover(crash_after=self.crash_after)

    async def close(self) -> None:
        """DBOS's verdict read, then its system database dropped and the lives' files removed."""
        try:
            await super().close()
        finally:
            if self.system is not None:
                await self.system.drop()
