"""Agents the yardstick runs: the two reference baselines built as the documentation shows, and the kit.

An :class:`AgentSpec` names an agent and how to build its compiled graph from an :class:`AgentContext`
(the episode's model, an autocommit pool, the payment provider, the real ``AsyncPostgresSaver``);
:func:`resolve_agent` turns a name from the command line into one:

==================  ===========================================================================
``toolnode``        LangGraph's ``StateGraph`` + prebuilt ``ToolNode`` + ``tools_condition``
                    (:mod:`agentlab.lab.agents.toolnode`) on ``@tool`` functions
                    (:mod:`agentlab.lab.agents.billing_tools`)
``create_agent``    LangChain's ``create_agent`` (:mod:`agentlab.lab.agents.create_agent`), same tools
``kit`` / ``kit:P``  the kit's own graph and transactional tools node under preset ``P`` (default ``full``)
``module:factory``  your own: an :class:`AgentSpec`, a function ``factory(ctx) -> compiled graph``, or an
                    uncompiled ``StateGraph`` (compiled here with the lab's checkpointer)
==================  ===========================================================================
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agentlab.core.errors import AgentlabError
from agentlab.core.safeguards import PRESETS, Safeguards, preset

BASELINES = ("toolnode", "create_agent", "create_agent_hardened")


@dataclass
class AgentContext:
    """What an agent factory gets for one agent process of one episode.

    Attributes:
        model: the episode's chat model (the scripted model unless the run names a real one).
        pool: a psycopg ``AsyncConnectionPool`` (``autocommit=True``) on the episode's database, this
            process's own: a crash closes it with the process.
        provider: the payment provider (the outside world, shared by every process).
        checkpointer: the real ``AsyncPostgresSaver`` of this process.
        domain: the :class:`agentlab.core.domain.Domain` the episode runs on.
        events: the kit's event log (the kit's node writes to it; a foreign agent may ignore it).
        safeguards: for the kit's own agent, the episode's preset (a fault may scale a timeout down).
        exposed: what the built agent exposes to faults that need a hook inside it (the kit sets
            ``"node"``: its tools node); a foreign agent exposes nothing, so those faults are "n/a".
    """

    model: Any
    pool: Any
    provider: Any
    checkpointer: Any
    domain: Any
    events: Any = None
    safeguards: Any = None
    exposed: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentSpec:
    """An agent the yardstick can run.

    Attributes:
        name: its column in the table.
        build: ``build(ctx) -> compiled graph`` (called once per agent process: again after a crash).
        tool_names: the domain's tool name -> the agent's tool name, where they differ (the scripted
            model plays the domain's scenarios; the checker reads the domain's names).
        safeguards: the kit's own agent: the preset its tools node runs under (ledger and atomic-batch
            checks follow it). None for a foreign agent, checked as the ``constraints`` preset: the
            domain's strict schema, no transaction, no ledger.
        exposes: hooks the agent lets faults use (the kit: ``{"node_hooks"}``).
        description: one line for the table's legend.
        ref: the ``"package.module:factory"`` it was resolved from (None: a built-in name or an object), so
            that another process can rebuild it (:mod:`agentlab.lab.clients.process_death`).
        engine: a durable engine's agent, run by the lab in child processes instead of built here
            (``"dbos"``: :mod:`agentlab.lab.clients.dbos_client`; ``"temporal"``: :mod:`agentlab.lab.clients.temporal_client`;
            ``"pydantic_ai"``: the DBOS client running :mod:`agentlab.lab.clients.pydantic_ai_app`;
            ``"pydantic_ai_temporal"``: the Temporal client running :mod:`agentlab.lab.clients.pydantic_ai_temporal_app`);
            None for a LangGraph agent.
        scenarios: the scenarios it can play (empty: every scenario of the domain); another one is ``n/a``.
    """

    name: str
    build: Callable[[AgentContext], Any]
    tool_names: Mapping[str, str] = field(default_factory=dict)
    safeguards: Safeguards | None = None
    exposes: frozenset[str] = frozenset()
    description: str = ""
    ref: str | None = None
    engine: str | None = None
    scenarios: tuple[str, ...] = ()

    @property
    def checked_as(self) -> Safeguards:
        """The safeguards the invariant checker assumes (the schema written, ledger and atomic checks)."""
        return self.safeguards or preset("constraints")


def _toolnode(ctx: AgentContext):
    from agentlab.lab.agents.billing_tools import billing_tools
    from agentlab.lab.agents.toolnode import build_toolnode_agent

    return build_toolnode_agent(ctx.model, billing_tools(ctx.pool, ctx.provider), checkpointer=ctx.checkpointer)


def _create_agent(ctx: AgentContext):
    from agentlab.lab.agents.billing_tools import billing_tools
    from agentlab.lab.agents.create_agent import build_create_agent

    return build_create_agent(ctx.model, billing_tools(ctx.pool, ctx.provider), checkpointer=ctx.checkpointer)


def _create_agent_hardened(ctx: AgentContext):
    from agentlab.lab.agents.billing_tools import billing_tools
    from agentlab.lab.agents.create_agent import build_hardened_create_agent

    return build_hardened_create_agent(ctx.model, billing_tools(ctx.pool, ctx.provider), checkpointer=ctx.checkpointer)


def kit_agent(preset_name: str = "full") -> AgentSpec:
    """The kit's own agent (:func:`agentlab.core.graph.build_graph` on a
    :class:`agentlab.core.batch.TransactionalToolsNode`) under ``preset_name``. Raises ValueError
    naming the presets."""
    sg = preset(preset_name)

    def build(ctx: AgentContext):
        from agentlab.core.batch import TransactionalToolsNode
        from agentlab.core.graph import RETRY_ATTEMPTS, build_graph

        node = TransactionalToolsNode(ctx.pool, ctx.safeguards or sg, toolset=ctx.domain.toolset, provider=ctx.provider,
                                      events=ctx.events, max_attempts=RETRY_ATTEMPTS, error_hints=ctx.domain.error_hints)
        ctx.exposed["node"] = node
        return build_graph(ctx.model, node, checkpointer=ctx.checkpointer)

    return AgentSpec(f"kit:{preset_name}", build, safeguards=sg, exposes=frozenset({"node_hooks"}),
                     description=f"the kit's graph and transactional tools node, preset {preset_name}")


DBOS_SHAPES = ("transactions", "steps")


def dbos_agent(shape: str) -> AgentSpec:
    """The DBOS agent of ``shape`` (:mod:`agentlab.lab.clients.dbos_app`): ``"transactions"`` (the docs' datasource
    transactions, the provider call a step) or ``"steps"`` (every tool a step). It plays billing's refund story
    only (its tools are those four). Raises AgentlabError naming the shapes."""
    from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES

    if shape not in DBOS_SHAPES:
        raise AgentlabError(f"unknown DBOS agent shape {shape!r}; choose dbos:{' or dbos:'.join(DBOS_SHAPES)}")
    what = "tools as datasource transactions, the provider call a step" if shape == "transactions" else "every tool a step"
    return AgentSpec(f"dbos:{shape}", _engine_built_elsewhere, BASELINE_TOOL_NAMES, engine="dbos",
                     scenarios=("refund",), description=f"DBOS Transact workflow, {what}")


TEMPORAL_SHAPES = ("activities",)


def temporal_agent(shape: str) -> AgentSpec:
    """The Temporal agent of ``shape`` (:mod:`agentlab.lab.clients.temporal_app`): ``"activities"`` (an activity per
    tool and for the model call, as Temporal's docs show). It plays billing's refund story only. Raises
    AgentlabError naming the shapes."""
    from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES

    if shape not in TEMPORAL_SHAPES:
        raise AgentlabError(f"unknown Temporal agent shape {shape!r}; choose temporal:{' or temporal:'.join(TEMPORAL_SHAPES)}")
    return AgentSpec(f"temporal:{shape}", _engine_built_elsewhere, BASELINE_TOOL_NAMES, engine="temporal",
                     scenarios=("refund",), description="Temporal workflow, an activity per tool")


PYDANTIC_AI_SHAPES = ("dbos", "temporal")


def pydantic_ai_agent(shape: str) -> AgentSpec:
    """Pydantic AI's durable agent of ``shape``: ``"dbos"`` (:mod:`agentlab.lab.clients.pydantic_ai_app`: an
    ``Agent`` with ``capabilities=[DBOSDurability()]`` in a DBOS workflow, the function tools ``@DBOS.step`` functions,
    as its docs show) or ``"temporal"`` (:mod:`agentlab.lab.clients.pydantic_ai_temporal_app`: an ``Agent`` with
    ``capabilities=[TemporalDurability()]`` in a Temporal workflow, each model request and tool call an activity). It plays billing's refund story only. Raises AgentlabError naming the shapes."""
    from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES

    if shape not in PYDANTIC_AI_SHAPES:
        raise AgentlabError(f"unknown Pydantic AI agent shape {shape!r}; choose "
                            f"pydantic_ai:{' or pydantic_ai:'.join(PYDANTIC_AI_SHAPES)}")
    if shape == "temporal":
        return AgentSpec("pydantic_ai:temporal", _engine_built_elsewhere, BASELINE_TOOL_NAMES,
                         engine="pydantic_ai_temporal", scenarios=("refund",),
                         description="Pydantic AI Agent with TemporalDurability, every tool call an activity")
    return AgentSpec(f"pydantic_ai:{shape}", _engine_built_elsewhere, BASELINE_TOOL_NAMES, engine="pydantic_ai",
                     scenarios=("refund",), description="Pydantic AI Agent with DBOSDurability, every tool a DBOS step")


def _engine_built_elsewhere(ctx: AgentContext):
    raise AgentlabError("a durable engine's agent runs in its own processes (agentlab.lab.clients), not in a graph")


def baseline(name: str) -> AgentSpec:
    """One of :data:`BASELINES` on the billing tools. Raises ValueError naming them."""
    from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES

    if name == "toolnode":
        return AgentSpec("toolnode", _toolnode, BASELINE_TOOL_NAMES,
                         description="LangGraph StateGraph + prebuilt ToolNode + tools_condition, @tool functions")
    if name == "create_agent":
        return AgentSpec("create_agent", _create_agent, BASELINE_TOOL_NAMES,
                         description="LangChain create_agent, the same @tool functions")
    if name == "create_agent_hardened":
        return AgentSpec("create_agent_hardened", _create_agent_hardened, BASELINE_TOOL_NAMES,
                         description="create_agent with ToolRetryMiddleware and ToolErrorMiddleware, as their docs "
                         "compose them")
    raise ValueError(f"unknown baseline {name!r}; choose one of: {', '.join(BASELINES)}")


def resolve_agent(agent: AgentSpec | str | Callable | Any, *, name: str | None = None) -> AgentSpec:
    """An :class:`AgentSpec` from ``agent``: a spec (returned as is), ``"toolnode"``, ``"create_agent"``,
    ``"kit"`` / ``"kit:PRESET"``, ``"package.module:factory"``, a factory ``f(ctx) -> compiled graph``, or
    an uncompiled ``StateGraph`` (compiled per process with the lab's checkpointer; its model is its own).

    Raises:
        AgentlabError: an unknown name, a module that does not import, or an attribute that is none of these.
    """
    if isinstance(agent, AgentSpec):
        return agent
    if isinstance(agent, str):
        if agent in BASELINES:
            return baseline(agent)
        if agent.startswith("dbos:"):
            return dbos_agent(agent[5:])
        if agent.startswith("temporal:"):
            return temporal_agent(agent[9:])
        if agent.startswith("pydantic_ai:"):
            return pydantic_ai_agent(agent[12:])
        if agent == "kit" or (agent.startswith("kit:") and agent[4:] in PRESETS):
            return kit_agent("full" if agent == "kit" else agent[4:])
        module_name, sep, attr = agent.partition(":")
        if not sep or not attr or agent.startswith("kit:"):
            raise AgentlabError(f"unknown agent {agent!r}; choose toolnode, create_agent, create_agent_hardened, kit, "
                                f"kit:PRESET, dbos:transactions, dbos:steps, temporal:activities, pydantic_ai:dbos, "
                                f"pydantic_ai:temporal "
                                f"(presets: {', '.join(PRESETS)}) or package.module:factory")
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise AgentlabError(f"agent {agent!r} does not load: {type(exc).__name__}: {exc}") from exc
        return replace(resolve_agent(target, name=name or attr), ref=agent)
    from langgraph.graph import StateGraph

    if isinstance(agent, StateGraph):
        return AgentSpec(name or "graph", lambda ctx: agent.compile(checkpointer=ctx.checkpointer),
                         description="a StateGraph with its own model and tools")
    if callable(agent):
        return AgentSpec(name or getattr(agent, "__name__", "agent"), agent, description="a graph factory")
    raise AgentlabError(f"an agent must be an AgentSpec, a factory f(ctx) -> compiled graph or a StateGraph, "
                        f"not {type(agent).__name__}")


def rename_script(script: list[list], names: dict[str, str]) -> list[list]:
    """The scripted model's batches with the domain's tool names replaced by the agent's (``names``)."""
    return [[replace(call, tool=names.get(call.tool, call.tool)) for call in step] for step in script]


def as_domain_messages(messages: Sequence[BaseMessage], names: dict[str, str]) -> list[BaseMessage]:
    """``messages`` with the agent's tool names mapped back to the domain's (``names`` is domain ->
    agent), so the domain's invariants read the calls they know. Other messages are kept as they are."""
    back = {v: k for k, v in names.items()}
    if not back:
        return list(messages)
    out: list[BaseMessage] = []
    for m in messages:
        if isinstance(m, AIMessage) and m.tool_calls:
            calls = [{**tc, "name": back.get(tc["name"], tc["name"])} for tc in m.tool_calls]
            m = m.model_copy(update={"tool_calls": calls})
        elif isinstance(m, ToolMessage) and m.name in back:
            m = m.model_copy(update={"name": back[m.name]})
        out.append(m)
    return out


def describe_raised(exc: BaseException) -> str:
    """What an agent's run raised, as the table shows it: the exception's class, and the SQLSTATE when
    PostgreSQL gave one."""
    state = getattr(exc, "sqlstate", None)
    return type(exc).__name__ + (f" ({state})" if state else "")
