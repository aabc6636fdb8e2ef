"""The refund story as Pydantic AI's docs write a durable agent on DBOS, run by the lab in a child process: one
life per process, as :mod:`agentlab.lab.clients.dbos_app` (same command line, same parent:
:class:`agentlab.lab.clients.dbos_agent.DbosAgent` with ``app=`` this module).

What a Pydantic AI user writes (:func:`build_app`), every default untouched:

- ``DBOS(config=...)`` and ``DBOS.launch()`` as DBOS's quickstart; ``Agent(model, name=..., tools=[...],
  capabilities=[DBOSDurability()])`` (Pydantic AI "Durable Execution with DBOS"; ``DBOSDurability`` replaces
  the deprecated ``DBOSAgent``), run with ``await agent.run(prompt)`` inside the user's ``@DBOS.workflow()``;
  the capability makes each model request a DBOS step and runs the tool calls of one response in parallel
  (its default, ``parallel_execution_mode="parallel_ordered_events"``);
- the four refund tools are function tools, which the capability does not wrap: as the docs say, the user
  makes each a ``@DBOS.step()``. They are :func:`agentlab.lab.clients.dbos_app.step_tools`' (the kit's SQL,
  each tool its own committed connection, the refund calling the provider in the same step);
- a tool's database error is turned into ``ModelRetry(str(exc))`` (:data:`HANDLES_TOOL_ERRORS`), as the docs'
  tools ask the model to try again; left out, the error escapes ``agent.run`` and the workflow ends ERROR.
  Pydantic AI validates each call's arguments against the tool's signature before running it, so a
  malformed argument (the refund story's ``"12'"``) comes back to the model as a retry prompt and never
  reaches the database.

The model is the kit's scripted one (:class:`agentlab.sim.model.ScriptedChatModel`) behind a
``FunctionModel`` (:mod:`agentlab.lab.clients.pydantic_ai_model`, shared with Pydantic AI's agent on Temporal): Pydantic AI's messages are mapped to LangChain's (:func:`to_langchain`), the scripted
model answers, and its AIMessage becomes a ``ModelResponse`` (its plan kept in ``provider_details``), so the
same seed gives the same calls as every other agent. The run's messages, mapped to LangChain's, are published
with ``DBOS.set_event`` (:data:`agentlab.lab.clients.dbos_app.MESSAGES_EVENT`) for the kit's checker, also
when the run raised. The crash hook is dbos_app's :func:`agentlab.lab.clients.dbos_app.watch_for_crash`.

Sources: ai.pydantic.dev "Durable Execution with DBOS", "Function Tools" (``ModelRetry``), "Unit testing"
(``FunctionModel``); ``pydantic_ai/durable_exec/dbos/_durability.py`` (2.68.0).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agentlab.lab.clients.dbos_app import MESSAGES_EVENT, provider_refunder, serve_life, step_tools
from agentlab.lab.clients.engine import INSTALL_HINT
from agentlab.lab.clients.pydantic_ai_model import PLAN_DETAIL, PLAYS, to_langchain  # noqa: F401 (importable from here)
from agentlab.lab.clients.pydantic_ai_model import as_function_tool as function_tool
from agentlab.lab.clients.pydantic_ai_model import scripted_model as shared_scripted_model

APP_NAME = "agentlab-pydantic-ai"
AGENT_NAME = "refund_agent"
HANDLES_TOOL_ERRORS = True  # a tool's database error becomes ModelRetry(str(exc)), as the docs' tools do


def engine_missing() -> str | None:
    """One line saying how to install Pydantic AI (with DBOS) when it is not importable here; None when it is."""
    try:
        import dbos  # noqa: F401
        import pydantic_ai  # noqa: F401
    except ImportError:
        return f"the Pydantic AI agent needs pydantic-ai-slim[dbos], an optional install: {INSTALL_HINT}"
    return None


def scripted_model():
    """The kit's scripted model (:func:`agentlab.lab.clients.pydantic_ai_model.scripted_model`) playing the
    current DBOS workflow's script (:data:`PLAYS`, keyed by ``DBOS.workflow_id``)."""
    from dbos import DBOS

    return shared_scripted_model(lambda: DBOS.workflow_id)


def as_function_tool(step):
    """``step`` (a ``@DBOS.step()`` tool) as the function tool the agent registers: the same signature and
    docstring; a database error (SQLAlchemy's ``DBAPIError``) raised as ``ModelRetry`` with its text when
    :data:`HANDLES_TOOL_ERRORS`."""
    from sqlalchemy.exc import DBAPIError

    return function_tool(step, (DBAPIError,) if HANDLES_TOOL_ERRORS else ())


def build_app(app_url: str, system_url: str, provider_conninfo: str) -> dict[str, Any]:
    """Register the agent with DBOS as Pydantic AI's docs write it (see the module's docstring).

    Args:
        app_url: the episode's database as a SQLAlchemy URL (``postgresql+psycopg://...``).
        system_url: DBOS's system database, a SQLAlchemy URL on the same server.
        provider_conninfo: the payment provider's database (a psycopg conninfo).

    Returns:
        ``{"workflow": refund_agent, "engines": [engine]}``: the async workflow
        ``refund_agent(prompt: str, script: list, seed: int) -> str`` (the agent's output) and the SQLAlchemy
        engine the tools write through.
    """
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig
    from langchain_core.messages import messages_to_dict
    from pydantic_ai import Agent, capture_run_messages
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    config: DBOSConfig = {"name": APP_NAME, "system_database_url": system_url}
    DBOS(config=config)
    engine = sa.create_engine(app_url)
    tools = [as_function_tool(t) for t in step_tools(engine, provider_refunder(provider_conninfo)).values()]
    agent = Agent(scripted_model(), name=AGENT_NAME, tools=tools, capabilities=[DBOSDurability()])

    @DBOS.workflow()
    async def refund_agent(prompt: str, script: list, seed: int) -> str:
        PLAYS[DBOS.workflow_id] = (script, seed)
        with capture_run_messages() as messages:
            try:
                result = await agent.run(prompt)
            finally:
                await DBOS.set_event_async(MESSAGES_EVENT, messages_to_dict(to_langchain(messages)))
        return str(result.output)

    return {"workflow": refund_agent, "engines": [engine]}


async def play(mode: str, spec: dict, workflow) -> None:
    """Start the workflow (``mode`` ``"start"``) or wait for the one ``DBOS.launch()`` recovered
    (``"recover"``); its ERROR is the engine's verdict, read by the parent, so it is only noted here."""
    from dbos import DBOS, SetWorkflowID

    if mode == "start":
        from agentlab.core.scenario import PlannedCall

        script = [[PlannedCall(**call) for call in step] for step in spec["script"]]
        with SetWorkflowID(spec["workflow_id"]):
            handle = await DBOS.start_workflow_async(workflow, spec["prompt"], script, spec["seed"])
    else:
        handle = await DBOS.retrieve_workflow_async(spec["workflow_id"])
    try:
        await handle.get_result()
    except Exception as exc:  # noqa: BLE001 (the workflow's ERROR is the engine's verdict, read by the parent)
        print(f"agentlab: the workflow ended with {type(exc).__name__}: {exc}"[:400], file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """``start SPEC`` or ``recover SPEC`` (SPEC: the JSON file :class:`agentlab.lab.clients.dbos_agent.DbosAgent`
    writes): one life, as :func:`agentlab.lab.clients.dbos_app.serve_life` runs a DBOS application. Returns 0 once
    the workflow ended; a crash fault ends the process earlier with
    :data:`agentlab.lab.clients.dbos_app.CRASH_EXIT_CODE`."""
    return serve_life(argv, build_app, lambda mode, spec, workflow: asyncio.run(play(mode, spec, workflow)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
