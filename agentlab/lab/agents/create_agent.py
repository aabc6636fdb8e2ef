"""LangChain 1.x's agent as its documentation builds it: ``create_agent(model, tools, checkpointer=...)``.

LangChain's "Agents" page: ``from langchain.agents import create_agent``; ``agent = create_agent(model,
tools=[...])``, a checkpointer for memory. No middleware, no system prompt, every default untouched
(each tool call runs as its own task of the super-step; a tool's exception other than invalid
arguments is raised). Measured with langchain 1.5.2.

:func:`build_hardened_create_agent` is the careful LangChain user's version, as the middleware's own docs compose
it: ``ToolRetryMiddleware`` inner with ``on_failure="error"`` (its defaults otherwise: every exception retried
twice, 1 s then 2 s apart, with jitter) and ``ToolErrorMiddleware`` outer, whose handler returns a message that
names the exception's type, never its text ("Prefer returning content that names the exception type over the
raw exception message"). Sources: LangChain's API reference for ``ToolErrorMiddleware`` and
``ToolRetryMiddleware`` (``langchain.agents.middleware``).
"""

from __future__ import annotations

from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware


def build_create_agent(model, tools, checkpointer=None):
    """The compiled agent of LangChain's documentation for ``model`` and ``tools``."""
    return create_agent(model, tools=tools, checkpointer=checkpointer)


def on_tool_error(exc: Exception, request) -> str:
    """The docs' handler: the tool's name and the exception's type, and the advice to fix the input and retry."""
    return f"`{request.tool_call['name']}` failed ({type(exc).__name__}); fix the input and retry."


def build_hardened_create_agent(model, tools, checkpointer=None):
    """``create_agent`` with ``ToolErrorMiddleware`` (outer) and ``ToolRetryMiddleware`` (inner), as their docs
    compose them: a tool's exception is retried, then returned to the model as an error ToolMessage."""
    middleware = [ToolErrorMiddleware(on_tool_error), ToolRetryMiddleware(on_failure="error")]
    return create_agent(model, tools=tools, checkpointer=checkpointer, middleware=middleware)
