"""One life of an agent in a process of its own: ``python -m agentlab.lab.clients.child`` reads a JSON spec on
stdin, plays the user's turn (or resumes the thread) and prints one JSON line: ``raised`` (null, or what the
agent raised: ``"OperationalError (57P01)"``) and ``no_checkpoint`` (a resume found no checkpoint). Started by :class:`agentlab.lab.clients.process_death.
ChildProcessClient`; a death flag (:mod:`agentlab.lab.nemesis.death`) makes it die for real on the way into the
checkpointer (exit status 99), after the tools step committed and before its result is recorded.

The spec: ``url``, ``domain`` (a name :func:`agentlab.runtime.domains.resolve_domain` takes), ``agent`` (a name
:func:`agentlab.lab.agents.resolve_agent` takes), ``scenario``, ``seed``, ``thread_id``, ``tenant_id``,
``customer_ids``, ``prompt`` (None: resume), ``durability``, ``death_flag`` (None: never dies).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import psycopg
from langchain_core.messages import HumanMessage
from langgraph.errors import EmptyInputError

from agentlab.lab.agents import describe_raised, rename_script, resolve_agent
from agentlab.lab.clients.agent_process import AgentRun, EpisodeProcess, carries_tool_message, quiet
from agentlab.lab.clients.graph_agent import build_agent
from agentlab.lab.nemesis.death import claim, die
from agentlab.lab.process import CrashableSaver
from agentlab.lab.wire import NetworkProvider
from agentlab.runtime.harness import Harness
from agentlab.sim.model import ScriptedChatModel


class DyingSaver(CrashableSaver):
    """The real checkpointer, in a process that dies (``os._exit``) when a tools step's result reaches it and
    this process claims the episode's death flag: the step's effects are committed, its record is not."""

    def __init__(self, conn, *, flag: str | None, claimer: psycopg.AsyncConnection | None, **kwargs):
        super().__init__(conn, **kwargs)
        self.flag, self.claimer = flag, claimer

    async def _maybe_die(self) -> None:
        if self.flag is not None and await claim(self.claimer, self.flag):
            die()

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        if any(carries_tool_message(v) for _, v in writes):
            await self._maybe_die()
        return await super().aput_writes(config, writes, task_id, task_path)

    async def aput(self, config, checkpoint, metadata, new_versions):
        # durability "exit" hands no step's writes to the saver: its one checkpoint, at the end, is the record
        if carries_tool_message(checkpoint.get("channel_values", {}).get("messages")):
            await self._maybe_die()
        return await super().aput(config, checkpoint, metadata, new_versions)


async def play(spec: dict) -> dict:
    """One life of the agent described by ``spec`` (see the module's docstring); returns the JSON result."""
    h = await Harness.open(spec["url"], domain=spec["domain"], pool_max=2)
    claimer = await psycopg.AsyncConnection.connect(spec["url"], autocommit=True) if spec["death_flag"] else None
    process: EpisodeProcess | None = None
    try:
        agent = resolve_agent(spec["agent"])
        sc = h.scenario(spec["scenario"]).clean()
        ids = list(spec["customer_ids"])
        sg = agent.checked_as
        run = AgentRun(agent.name, spec["fault"], sc, spec["seed"], thread_id=spec["thread_id"], customer_ids=ids,
                       safeguards=sg, harness=h, outbox=sg.outbox)
        run.network_provider = NetworkProvider(h.provider)
        process = await EpisodeProcess(h.url).open()
        process.saver = DyingSaver(process.checkpointer_pool, flag=spec["death_flag"], claimer=claimer)
        run.saver = process.saver
        before = set(asyncio.all_tasks())
        model = ScriptedChatModel(script=rename_script(sc.script(ids), dict(agent.tool_names)), seed=spec["seed"])
        graph = build_agent(agent, process, model, run, h.domain, h.events)
        config = spec["config"]
        value = {"messages": [HumanMessage(spec["prompt"])]} if spec["prompt"] is not None else None
        result: dict[str, Any] = {"raised": None, "no_checkpoint": False}
        try:
            await graph.ainvoke(value, config, durability=spec["durability"])
        except EmptyInputError:  # a resume with nothing to resume: the lab decides what the user does
            result["no_checkpoint"] = True
        except Exception as exc:  # noqa: BLE001 (what the agent raised is a result)
            result["raised"] = describe_raised(exc)
        await quiet(before)
        await h.events.flush()
        return result
    finally:
        if process is not None:
            await process.close()
        if claimer is not None:
            await claimer.close()
        await h.close()


def main() -> int:
    spec = json.loads(sys.stdin.read())
    result = asyncio.run(play(spec))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
