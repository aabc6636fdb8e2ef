"""What Pydantic AI's durable agents share, whichever engine runs them (DBOS: :mod:`agentlab.lab.clients.pydantic_ai_app`;
Temporal: :mod:`agentlab.lab.clients.pydantic_ai_temporal_app`): the kit's scripted model behind a
``FunctionModel``, Pydantic AI's messages mapped to LangChain's, and a tool's database error turned into
``ModelRetry`` as the docs' tools do.

No engine is imported here: each app says how to find the run its model call belongs to (``current() -> key``
of :data:`PLAYS`: DBOS's workflow id, or the Temporal activity's).

Sources: ai.pydantic.dev "Unit testing" (``FunctionModel``), "Function Tools" (``ModelRetry``),
``pydantic_ai/messages.py`` (2.68.0).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

PLAN_DETAIL = "agentlab_plan"  # the scripted model's plan, carried in ModelResponse.provider_details

PLAYS: dict[str, tuple[list, int]] = {}
"""The script and seed of each run playing in this process (run key, the workflow's id -> (script, seed)),
set by the app from the workflow's recorded input, so a recovered run plays the script it started with."""


def to_langchain(messages: list) -> list:
    """Pydantic AI's ``ModelMessage`` list as LangChain messages: a user prompt a HumanMessage, a response an
    AIMessage (its tool calls, its text, the scripted plan back in ``response_metadata``), a tool's return a
    ToolMessage (``status="error"`` unless its ``outcome`` is ``"success"``: Pydantic AI 2.x returns a retry
    or a failure as a return part), a retry prompt for a tool a ToolMessage with ``status="error"``; the
    content is the text the model reads.
    Other parts (system prompts, retries without a tool) are left out."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    from agentlab.sim.model import PLAN_KEY

    out: list = []
    for m in messages:
        if isinstance(m, ModelResponse):
            calls = [{"name": p.tool_name, "args": p.args_as_dict(), "id": p.tool_call_id, "type": "tool_call"}
                     for p in m.parts if isinstance(p, ToolCallPart)]
            text = "".join(p.content for p in m.parts if isinstance(p, TextPart))
            plan = (m.provider_details or {}).get(PLAN_DETAIL)
            out.append(AIMessage(content=text, tool_calls=calls, response_metadata={PLAN_KEY: plan} if plan else {}))
        elif isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart):
                    out.append(HumanMessage(p.content if isinstance(p.content, str) else str(p.content)))
                elif isinstance(p, ToolReturnPart):  # a retry or a failure is a return part with its outcome
                    out.append(ToolMessage(p.model_response_str(), tool_call_id=p.tool_call_id, name=p.tool_name,
                                           status="success" if p.outcome == "success" else "error"))
                elif isinstance(p, RetryPromptPart) and p.tool_name:
                    out.append(ToolMessage(p.model_response(), tool_call_id=p.tool_call_id, name=p.tool_name,
                                           status="error"))
    return out


def scripted_model(current: Callable[[], str]):
    """A ``FunctionModel`` playing the script of the run ``current()`` names (a key of :data:`PLAYS`: batches of
    :class:`agentlab.core.scenario.PlannedCall`, the agent's tool names) with
    :class:`agentlab.sim.model.ScriptedChatModel` seeded by its seed. Raises KeyError when :data:`PLAYS` has
    no such run."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def play(messages: list, info: AgentInfo) -> ModelResponse:
        from agentlab.sim.model import PLAN_KEY, ScriptedChatModel  # here: a Temporal workflow builds the model too

        script, seed = PLAYS[current()]
        reply = ScriptedChatModel(script=script, seed=seed).invoke(to_langchain(messages))
        if not reply.tool_calls:
            return ModelResponse(parts=[TextPart(str(reply.content))])
        parts = [ToolCallPart(c["name"], c["args"], tool_call_id=c["id"]) for c in reply.tool_calls]
        return ModelResponse(parts=parts, provider_details={PLAN_DETAIL: reply.response_metadata[PLAN_KEY]})

    return FunctionModel(play, model_name="agentlab-scripted")


def as_function_tool(tool, errors: tuple[type[BaseException], ...]):
    """``tool`` (sync or async) as the function tool an agent registers: the same signature and docstring; an
    error of ``errors`` (the database's) raised as ``ModelRetry`` with its text, as the docs' tools ask the
    model to try again. ``errors`` empty: ``tool`` itself."""
    from pydantic_ai import ModelRetry

    if not errors:
        return tool
    if inspect.iscoroutinefunction(tool):
        @functools.wraps(tool)
        async def atool(*args, **kwargs):
            try:
                return await tool(*args, **kwargs)
            except errors as exc:
                raise ModelRetry(str(exc)) from exc

        return atool

    @functools.wraps(tool)
    def stool(*args, **kwargs):
        try:
            return tool(*args, **kwargs)
        except errors as exc:
            raise ModelRetry(str(exc)) from exc

    return stool
