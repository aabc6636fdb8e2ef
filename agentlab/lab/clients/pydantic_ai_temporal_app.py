"""The refund story as Pydantic AI's docs write a durable agent on Temporal, run by the lab in a child process: one
worker per process, as :mod:`agentlab.lab.clients.temporal_app` (same command line, same parent:
:class:`agentlab.lab.clients.pydantic_ai_temporal.PydanticAITemporalAgent`).

What a Pydantic AI user writes, every default untouched except one:

- a module-level ``Agent(model, name=..., tools=[...], capabilities=[TemporalDurability(...)])`` (Pydantic AI
  "Durable Execution with Temporal"; in 2.68 ``TemporalAgent(agent)`` is deprecated in favour of the
  ``TemporalDurability`` capability, ``pydantic_ai/durable_exec/temporal/_agent.py``), run with
  ``await agent.run(prompt)`` in a ``@workflow.defn`` class that lists it in ``__pydantic_ai_agents__``
  (``PydanticAIWorkflow``), on a client and worker with ``PydanticAIPlugin()``, which registers the agent's
  activities: the model request is an activity, and so is each function tool's call
  (``agent__refund_agent__toolset__<id>__call_tool``, the tool's name in its ``CallToolParams``); one
  response's tool calls run in parallel (Pydantic AI's default);
- the one setting changed: ``activity_config``'s ``start_to_close_timeout`` :data:`START_TO_CLOSE` (3 s, the
  capability's default is 60 s), so an activity whose worker died is retried within seconds, as
  :mod:`agentlab.lab.clients.temporal_app` does; the retry policy stays Temporal's default (no attempt cap);
- the four refund tools are function tools running the kit's SQL
  (:func:`agentlab.lab.clients.temporal_app.tool_functions`, each tool its own committed transaction, the
  refund calling the provider inside its transaction); a tool's database error becomes
  ``ModelRetry(str(exc))`` (:func:`agentlab.lab.clients.pydantic_ai_model.as_function_tool`), as the docs'
  tools ask the model to try again; the provider's error is raised, so Temporal's retry policy runs the
  activity again (a refund the provider refuses every time is retried without end: ``stuck_retry``).

The model is the kit's scripted one behind a ``FunctionModel``
(:func:`agentlab.lab.clients.pydantic_ai_model.scripted_model`), playing the script of the activity's workflow
(the workflow's recorded input: the start spec's, or read back from Temporal's history on recovery). The run's
messages are the workflow's query :meth:`RefundAgentWorkflow.messages` (Pydantic AI's messages as JSON); the
worker life writes them, mapped to LangChain's (``messages_to_dict``), to the spec's ``messages_path`` each
:data:`PUBLISH_EVERY_S` and once the workflow ended, for the parent and the kit's checker.

The lab's one hook (:func:`crash_interceptor`, a worker interceptor, the nemesis, not the user's code): once a
tool activity for :data:`CRASH_TOOL` returned the tool's value (its transaction committed), the process claims
the episode's death flag (:mod:`agentlab.lab.nemesis.death`) and dies with ``os._exit(99)`` before the worker
reports the completion.

Sources: ai.pydantic.dev "Durable Execution with Temporal"; ``pydantic_ai/durable_exec/temporal/__init__.py``
(``PydanticAIPlugin``), ``_durability.py`` (``TemporalDurability``, its 60 s default), ``_function_toolset.py``
and ``_operation_names.py`` (the tool activity and its name) in pydantic-ai-slim 2.68.0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():  # the host's modules, not re-run in the workflow's sandbox
    import psycopg
    from pydantic_ai import Agent, capture_run_messages
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    import agentlab.domains.billing.tools  # noqa: F401 (the tools' SQL, which the sandbox must not import again)
    from agentlab.core.tasks import pause
    from agentlab.lab.clients.pydantic_ai_model import PLAYS, as_function_tool, scripted_model, to_langchain
    from agentlab.lab.clients.temporal_app import CRASH_ACTIVITY, tool_functions
    from agentlab.lab.nemesis.death import EXIT_CODE

AGENT_NAME = "refund_agent"
START_TO_CLOSE = timedelta(seconds=3)  # the capability's default is 60 s: a dead worker's activity waits that long
CRASH_TOOL = CRASH_ACTIVITY  # billing's deduction, "apply_credit"
CRASH_EXIT_CODE = EXIT_CODE
PUBLISH_EVERY_S = 0.5
TOOL_ERRORS = (psycopg.Error,)  # a tool's database error becomes ModelRetry(str(exc)), as the docs' tools do

WHERE: dict[str, str] = {}
"""Where the tools write in this worker (``conninfo``, ``provider_conninfo``), set by :func:`serve` before the
worker runs; the workflow's sandbox never calls a tool (tools run in activities, on the host)."""


def _bound(template):
    """``template`` (one of :func:`tool_functions`' typed tools) calling the same tool on :data:`WHERE`'s databases,
    with its signature, a database error as ``ModelRetry``."""

    @functools.wraps(template)
    async def tool(**kwargs):
        tools = {t.__name__: t for t in tool_functions(WHERE["conninfo"], WHERE["provider_conninfo"])}
        return await tools[template.__name__](**kwargs)

    return as_function_tool(tool, TOOL_ERRORS)


agent = Agent(scripted_model(lambda: activity.info().workflow_id), name=AGENT_NAME,
              tools=[_bound(t) for t in tool_functions("", "")],
              capabilities=[TemporalDurability(activity_config={"start_to_close_timeout": START_TO_CLOSE})])


@workflow.defn
class RefundAgentWorkflow(PydanticAIWorkflow):
    """``run(prompt, script, seed) -> str`` (the agent's output); ``script`` and ``seed`` are the scripted
    model's, recorded as the workflow's input."""

    __pydantic_ai_agents__ = [agent]

    def __init__(self) -> None:
        self._messages: list = []

    @workflow.run
    async def run(self, prompt: str, script: list, seed: int) -> str:
        with capture_run_messages() as messages:
            self._messages = messages
            result = await agent.run(prompt)
        return str(result.output)

    @workflow.query
    def messages(self) -> list:
        """The run's messages so far: Pydantic AI's ``ModelMessage`` list as JSON (``ModelMessagesTypeAdapter``)."""
        return ModelMessagesTypeAdapter.dump_python(self._messages, mode="json")


def deduction_returned(input, out) -> bool:
    """Whether a finished activity was a tool activity for :data:`CRASH_TOOL` that returned the tool's value
    (``kind == "tool_return"``: its transaction committed): where :func:`crash_interceptor` lets the worker die."""
    called = getattr(input.args[0], "name", None) if input.args else None
    return called == CRASH_TOOL and getattr(out, "kind", None) == "tool_return"


def crash_interceptor(conninfo: str, workflow_id: str):
    """The nemesis's hook (``crash_inside_step``): :func:`agentlab.lab.clients.temporal_app.crash_interceptor`
    dying after :func:`deduction_returned` (Pydantic AI names every tool activity alike, so the tool's name is
    read from its input)."""
    from agentlab.lab.clients.temporal_app import crash_interceptor as dies_after

    return dies_after(conninfo, workflow_id, deduction_returned)


async def publish(handle, path: str) -> None:
    """The workflow's messages (its query), mapped to LangChain's (``messages_to_dict``), written to ``path``
    (replaced whole, so the parent never reads half a file)."""
    from langchain_core.messages import messages_to_dict

    raw = await handle.query(RefundAgentWorkflow.messages)
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(messages_to_dict(to_langchain(ModelMessagesTypeAdapter.validate_python(raw)))))
    tmp.replace(path)


async def keep_publishing(handle, path: str) -> None:
    """:func:`publish` every :data:`PUBLISH_EVERY_S` seconds (the life may end at the lab's cap)."""
    while True:
        await pause(PUBLISH_EVERY_S)
        with contextlib.suppress(Exception):  # a query refused mid-task: the next one answers
            await publish(handle, path)


async def recorded_play(client, workflow_id: str) -> tuple[list, int]:
    """The workflow's ``script`` and ``seed`` as Temporal recorded them (its start event's input)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    _, script, seed = client.data_converter.payload_converter.from_payloads(started.input.payloads)
    return script, seed


async def serve(mode: str, spec: dict) -> int:
    """One worker life (see the module's docstring); returns 0 once the workflow ended."""
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client, WorkflowFailureError
    from temporalio.worker import Worker

    from agentlab.core.scenario import PlannedCall

    client = await Client.connect(spec["address"], plugins=[PydanticAIPlugin()])
    wid = spec["workflow_id"]
    WHERE.update(conninfo=spec["conninfo"], provider_conninfo=spec["provider_conninfo"])
    script, seed = (spec["script"], spec["seed"]) if mode == "start" else await recorded_play(client, wid)
    PLAYS[wid] = ([[PlannedCall(**call) for call in step] for step in script], seed)
    interceptors = [crash_interceptor(spec["conninfo"], wid)] if spec.get("crash") else []
    async with Worker(client, task_queue=spec["task_queue"], workflows=[RefundAgentWorkflow], interceptors=interceptors):
        if mode == "start":
            handle = await client.start_workflow(RefundAgentWorkflow.run, args=[spec["prompt"], script, seed],
                                                 id=wid, task_queue=spec["task_queue"])
        else:
            handle = client.get_workflow_handle(wid)
        publisher = asyncio.create_task(keep_publishing(handle, spec["messages_path"]))
        try:
            await handle.result()
        except WorkflowFailureError as exc:  # the workflow's FAILED is the engine's verdict, read by the parent
            print(f"agentlab: the workflow ended with {type(exc.cause).__name__}: {exc.cause}"[:400],
                  file=sys.stderr, flush=True)
        finally:
            publisher.cancel()
        await publish(handle, spec["messages_path"])
    return 0


def main(argv: list[str]) -> int:
    """``start SPEC`` or ``recover SPEC`` (SPEC: the JSON file
    :class:`agentlab.lab.clients.pydantic_ai_temporal.PydanticAITemporalAgent` writes), as
    :func:`agentlab.lab.clients.temporal_app.main` serves one. Returns 0 once the workflow ended; a crash fault ends
    the process earlier with :data:`CRASH_EXIT_CODE`."""
    from agentlab.lab.clients.temporal_app import main as serve_life

    return serve_life(argv, serve)


if __name__ == "__main__":
    from agentlab.lab.clients.temporal_app import exit_after

    exit_after(main(sys.argv[1:]))
