"""The Temporal agent as a client of the lab's one loop (:func:`agentlab.lab.loop.run`):
``Yardstick.run("temporal:activities", ...)`` plays it beside the LangGraph agents and DBOS, under the same faults
and the same checker.

Each worker life is a child process (:class:`agentlab.lab.clients.temporal_agent.TemporalAgent`): the first
starts the workflow, and after a death the next one, on the same task queue, is handed the workflow by the dev
server; there is no prompt to send again. Temporal's own verdict (``COMPLETED``, ``FAILED``, ``RUNNING`` at the
time cap) is kept in ``run.notes["engine"]`` beside the violations, with the lives' exit statuses, the dev
server's address and the versions measured.
"""

from __future__ import annotations

import shutil
import tempfile

from agentlab.core.errors import AgentlabError, SimulatedCrash
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.clients.temporal_agent import CAP_S, TemporalAgent, versions
from agentlab.lab.clients.temporal_server import shared_server
from agentlab.runtime.harness import Episode


class EngineStillRunning(AgentlabError):
    """The time cap ended the worker's process while Temporal still had the workflow RUNNING."""


class TemporalClient:
    """One episode of the Temporal agent (shape ``"activities"``). ``run`` is the
    :class:`agentlab.lab.clients.agent_process.AgentRun` (its ``thread_id`` is the workflow's id and task
    queue); ``script`` the scripted model's batches with the agent's tool names; ``crash`` arms the crash
    hook in each life (``crash_inside_step``: the death flag decides which life dies); ``cap_s`` bounds each
    life in seconds. The dev server is this process's (:func:`agentlab.lab.clients.temporal_server.shared_server`),
    started by the first episode (raises :class:`agentlab.lab.clients.temporal_server.DevServerError` when it
    cannot start)."""

    def __init__(self, spec, run, *, script: list, crash: bool, cap_s: float = CAP_S):
        self.spec, self.run, self.script, self.crash, self.cap_s = spec, run, script, crash, cap_s
        self.agent: TemporalAgent | None = None
        self.workdir: str | None = None

    def arms_after_build(self, nemesis) -> bool:
        return False

    async def open(self) -> None:
        """The dev server (started once per process) and the episode's files."""
        server = shared_server()
        self.workdir = tempfile.mkdtemp(prefix="agentlab-temporal-episode-")
        self.agent = TemporalAgent(self.run.harness.url, server.address, self.run.thread_id, self.workdir,
                                   cap_s=self.cap_s)
        self.run.notes["engine"] = {"server": server.address, "server_start_s": round(server.start_s, 2),
                                    "versions": versions()}

    async def build(self) -> None:
        pass  # each life registers the workflow and activities with its worker itself

    async def invoke(self, prompt: str | None) -> dict:
        """One worker life: the first starts the workflow, a later one picks it up. Raises
        :class:`SimulatedCrash` when the nemesis killed it, :class:`EngineStillRunning` at the time cap,
        :class:`AgentlabError` when the process failed otherwise."""
        if prompt is not None:
            life = await self.agent.start(prompt, self.script, self.run.seed, crash=self.crash)
        else:
            life = await self.agent.recover(crash=self.crash)
        if life.crashed:
            self.run.notes.setdefault("crashes", []).append(f"Temporal worker died (exit {life.returncode})")
            raise SimulatedCrash(f"the Temporal worker's process died (exit status {life.returncode})")
        if life.returncode is None:
            raise EngineStillRunning(f"the workflow was still running after {self.cap_s:g} s")
        if life.returncode != 0:
            raise AgentlabError(f"the Temporal worker's process exited with status {life.returncode}: "
                                f"{life.output_tail.strip().splitlines()[-1:] or ''}")
        return await self.state()

    def describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.run.raised = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        pass  # a life ends when its workflow does

    async def recover(self, nemesis) -> None:
        pass  # the next life's worker polls the same task queue

    async def resubmit(self) -> None:
        pass  # never asked: Temporal hands the workflow to the new worker, no prompt is sent again

    async def state(self) -> dict:
        return {"messages": await self.agent.messages()}

    async def new_worker(self) -> OutboxWorker:
        r = self.run
        return OutboxWorker(r.harness.pool, r.harness.provider, thread_id=r.thread_id)

    async def flush(self) -> None:
        await self.run.harness.events.flush()

    async def close(self) -> None:
        """Temporal's verdict read, then the lives' files removed (the workflow stays in the dev server's file,
        which goes with the server)."""
        try:
            if self.agent is not None:
                engine = self.run.notes["engine"]
                engine.update(await self.agent.verdict())
                engine["lives"] = [(life.mode, life.returncode, round(life.wall_s, 2)) for life in self.agent.lives]
                if engine["status"] not in ("COMPLETED", "NOT STARTED") and self.run.raised is None:
                    self.run.raised = f"Temporal {engine['status']}"
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        r, sc = self.run, self.run.scenario
        r.messages = list(state.get("messages", []))
        return Episode(sc.name, self.spec.name, r.thread_id, r.seed, r.customer_ids, r.safeguards.schema,
                       sc.tenant_id, messages=r.messages)
