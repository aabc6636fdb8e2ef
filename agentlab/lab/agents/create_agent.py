"""LangChain 1.x's agent as its documentation builds it: ``create_agent(model, tools, checkpointer=...)``.

LangChain's "Agents" page: ``from langchain.agents import create_agent``; ``agent = create_agent(model,
tools=[...])``, a checkpointer for memory. No middleware, no system prompt, every default untouched
(each tool call runs as its own task of the super-step; a tool's exception other than invalid
arguments is raised). Measured with langchain 1.5.2.
"""

from __future__ import annotations

from langchain.agents import create_agent


def build_create_agent(model, tools, checkpointer=None):
    """The compiled agent of LangChain's documentation for ``model`` and ``tools``."""
    return create_agent(model, tools=tools, checkpointer=checkpointer)
