"""The Temporal agent as a client of the lab's one loop (:func:`agentlab.lab.loop.run`):
``Yardstick.run("temporal:activities", ...)`` plays it beside the LangGraph agents and DBOS, under the same faults
and the same checker.

Each worker life is a child process (:class:`agentlab.lab.clients.temporal_agent.TemporalAgent`): the first
starts the workflow, and after a death the next one, on the same task queue, is handed the workflow by the dev
server; there is no prompt to send again. Temporal's own verdict (``COMPLETED``, ``FAILED``, ``RUNNING`` at the
time cap) is kept in ``run.notes["engine"]`` beside the violations, with the lives' exit statuses, the dev
server's address and the versions measured. What every engine's client shares is
:class:`agentlab.lab.clients.engine.EngineClient`.
"""

from __future__ import annotations

import tempfile

from agentlab.lab.clients.engine import EngineClient, EngineStillRunning  # noqa: F401 (importable from here)
from agentlab.lab.clients.temporal_agent import CAP_S, TemporalAgent, versions
from agentlab.lab.clients.temporal_server import shared_server


class TemporalClient(EngineClient):
    """One episode of the Temporal agent (shape ``"activities"``). ``run`` is the
    :class:`agentlab.lab.clients.agent_process.AgentRun` (its ``thread_id`` is the workflow's id and task
    queue); ``script`` the scripted model's batches with the agent's tool names; ``crash`` arms the crash
    hook in each life (``crash_inside_step``: the death flag decides which life dies); ``cap_s`` bounds each
    life in seconds. The dev server is this process's (:func:`agentlab.lab.clients.temporal_server.shared_server`),
    started by the first episode (raises :class:`agentlab.lab.clients.temporal_server.DevServerError` when it
    cannot start). The workflow stays in the dev server's file, which goes with the server. ``agent_class`` is the
    handle each episode gets (:class:`agentlab.lab.clients.temporal_agent.TemporalAgent`, or Pydantic AI's on
    Temporal); ``measured`` names the distributions whose versions are printed beside Temporal's."""

    engine, finished, what_dies = "Temporal", ("COMPLETED", "NOT STARTED"), "the Temporal worker's process"

    def __init__(self, spec, run, *, script: list, crash: bool, cap_s: float = CAP_S, route=None,
                 agent_class: type[TemporalAgent] = TemporalAgent, measured: tuple[str, ...] = ()):
        super().__init__(spec, run, script=script, crash=crash, cap_s=cap_s, route=route)
        self.agent_class, self.measured = agent_class, measured

    async def open(self) -> None:
        """The dev server (started once per process) and the episode's files."""
        server = shared_server()
        self.workdir = tempfile.mkdtemp(prefix="agentlab-temporal-episode-")
        self.agent = self.agent_class(self.run.harness.url, server.address, self.run.thread_id, self.workdir,
                                   cap_s=self.cap_s, route=self.route)
        self.run.notes["engine"] = {"server": server.address, "server_start_s": round(server.start_s, 2),
                                    "versions": versions(*self.measured)}

    async def start_life(self, prompt: str):
        return await self.agent.start(prompt, self.script, self.run.seed, crash=self.crash)

    async def recover_life(self):
        return await self.agent.recover(crash=self.crash)

    async def after_verdict(self) -> None:
        """A workflow still running at the time cap is terminated once its verdict (``RUNNING``, what the table
        shows) is read, so the dev server stops scheduling its retries."""
        if self.run.notes["engine"].get("status") == "RUNNING":
            await self.agent.terminate("the lab's time cap")
