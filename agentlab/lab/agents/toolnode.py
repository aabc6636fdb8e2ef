"""LangGraph's prebuilt agent loop as its documentation builds it: ``ToolNode`` with ``tools_condition``.

The graph of LangGraph's "Build a basic chatbot" / "Add tools" pages, line for line: a ``StateGraph`` over
``MessagesState``, a node that calls the model bound to the tools, the prebuilt ``ToolNode(tools)``
with its defaults (calls of one message run concurrently; a tool's exception other than invalid
arguments is raised, not turned into a message), ``tools_condition`` routing to it, and an edge back.
Measured with langgraph 1.2 and langgraph-prebuilt 1.1.3.
"""

from __future__ import annotations

from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


def build_toolnode_agent(model, tools, checkpointer=None):
    """The compiled documentation graph for ``model`` (a LangChain chat model) and ``tools``."""
    model_with_tools = model.bind_tools(tools)

    async def chatbot(state: MessagesState):
        return {"messages": [await model_with_tools.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chatbot", chatbot)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "chatbot")
    builder.add_conditional_edges("chatbot", tools_condition)
    builder.add_edge("tools", "chatbot")
    return builder.compile(checkpointer=checkpointer)
