"""The yardstick: the failure lab run against any LangGraph agent, side by side with the kit.

An agent (:class:`agentlab.lab.agents.AgentSpec`: the prebuilt ``ToolNode`` graph, LangChain's
``create_agent``, the kit under a preset, or your own factory) plays a domain's scenario on the
domain's schema and seed data, driven by the scripted model (or any chat model), under one fault;
the domain's and the generic invariants then read the database, the provider and the message
history. Every fault here needs no hook inside the agent's code:

===========================  ===========================================================================
fault                        mechanism, the same for every agent
===========================  ===========================================================================
hallucinations, constraints  the scripted model sends the bad arguments (the catalog's ``prepare``)
``lock_timeout``             a second session holds the customer's row lock (the catalog's)
``statement_timeout``        a trigger keeps the customer's UPDATE running (the catalog's)
``backend_killed``           a trigger marks the customer's UPDATE in ``pg_locks``; another real
                             connection runs ``pg_terminate_backend`` on that backend, mid-statement
``crash_before_checkpoint``  the checkpointer: the process dies when the tools step's ToolMessages
                             reach the saver, before they are written; a new process resumes the thread
``provider_timeout``         the fake provider performs the payment, then the request times out
``worker_crash``             the process calling the provider dies after the provider answered (the
                             provider handed to the agent; with the kit's outbox, the outbox worker)
``crash_mid_node``           needs a hook inside the tools step: only agents exposing ``node_hooks``
the concurrency family       two runs of the agent's graph at once on one customer (one thread, or two),
                             a barrier on the connections of the pool the agent is handed
                             (:mod:`agentlab.lab.yardstick_concurrency`)
===========================  ===========================================================================

A fault that cannot apply to an agent (a hook it does not expose, a hallucination a real model would
not make on cue) gives the cell ``n/a`` with the reason, never a pass.
:data:`agentlab.lab.yardstick_faults.YARDSTICK_FAULTS` is the registry;
:func:`agentlab.lab.yardstick_faults.register_fault` adds a fault (a family built elsewhere plugs in there).

Episodes run one at a time, each agent process with its own pools and saver, and the episode ends
only when the work the agent left running (a ``ToolNode`` sibling still in flight when another call
raised) has finished: so the same seed gives the same table.

``await Yardstick(harness).run("toolnode", "backend_killed")`` runs one episode;
``await run_yardstick(["toolnode", "create_agent", "kit"])`` (:mod:`agentlab.lab.yardstick_table`) the table;
``python -m agentlab chaos --agent toolnode create_agent kit`` prints it.

Sources: LangGraph docs "Persistence" (resuming a thread with ``None``), "ToolNode" (its error
handling); LangChain docs "Agents" (``create_agent``); PostgreSQL "pg_terminate_backend", "pg_locks".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from agentlab.core.outbox import OutboxWorker
from agentlab.lab import loop
from agentlab.lab.agents import (  # as_domain_messages, describe_raised: importable from here as before
    AgentSpec,
    as_domain_messages,  # noqa: F401
    describe_raised,  # noqa: F401
    rename_script,
    resolve_agent,
)
from agentlab.lab.checker import episode_checker
from agentlab.lab.clients.agent_process import (  # importable from here as before
    QUIET_CAP_S,  # noqa: F401
    AgentRun,
    BudgetedWiredConnection,  # noqa: F401
    EpisodeProcess,
    YardstickSaver,  # noqa: F401
    quiet,
)
from agentlab.lab.clients.dbos_client import DbosClient
from agentlab.lab.clients.graph_agent import GraphAgentClient, build_agent
from agentlab.lab.clients.process_death import ChildProcessClient
from agentlab.lab.faults import Concurrent
from agentlab.lab.wire import NetworkProvider
from agentlab.lab.workloads import scenarios
from agentlab.lab.yardstick_faults import NA, STUCK_RETRY_CAP_S, YardstickFault, get_yardstick_fault
from agentlab.runtime.harness import Harness
from agentlab.runtime.models import prompt_for_model
from agentlab.sim.model import ScriptedChatModel


def _rebuilt_by_name(spec: AgentSpec, *, scripted_model: bool) -> str | None:
    """Why ``spec`` cannot live in a child process (which rebuilds it from its name, :func:`rebuild_name`, and
    plays the scripted model), or None when it can."""
    if not scripted_model:
        return "a crash by real process death replays the scripted model in each new process"
    try:
        again = resolve_agent(rebuild_name(spec))
    except Exception:  # noqa: BLE001 (any failure to rebuild it means the same: n/a, with the reason)
        again = None
    if again is None or again.name != spec.name:
        return (f"a child process rebuilds the agent from its name; {spec.name!r} is not one "
                "(give it as 'package.module:factory')")
    return None


ENGINE_CAP_S = 60.0
PYDANTIC_AI_APP = "agentlab.lab.clients.pydantic_ai_app"  # the module each life of pydantic_ai:dbos runs
ENGINE_FAULTS = ("none", "refund_story", "crash_inside_step", "stuck_retry")
"""The faults a durable engine's agent can be put under: its tools are the refund story's, its crash is a real
process death (the kit's in-process hooks and the scripted hallucinations of other scenarios do not reach it);
under ``stuck_retry`` each life runs at most :data:`agentlab.lab.yardstick_faults.STUCK_RETRY_CAP_S`."""
ENGINE_NAMES = {"dbos": "DBOS", "temporal": "Temporal", "pydantic_ai": "Pydantic AI",
                "pydantic_ai_temporal": "Pydantic AI on Temporal"}


def _engine_cannot_play(spec: AgentSpec, yf, scenario: str, *, scripted_model: bool) -> str | None:
    """Why the engine agent ``spec`` cannot play ``scenario`` under ``yf`` (one line), or None when it can; an
    engine that is not installed says how to install it."""
    if spec.engine == "temporal":
        from agentlab.lab.clients.temporal_agent import engine_missing
    elif spec.engine == "pydantic_ai":
        from agentlab.lab.clients.pydantic_ai_app import engine_missing
    elif spec.engine == "pydantic_ai_temporal":
        from agentlab.lab.clients.pydantic_ai_temporal import engine_missing
    else:
        from agentlab.lab.clients.dbos_agent import engine_missing

    who = ENGINE_NAMES.get(spec.engine, spec.engine)
    if (missing := engine_missing()) is not None:
        return missing
    if not scripted_model:
        return f"the {who} agent plays the scripted model in each of its processes"
    if yf.name not in ENGINE_FAULTS:
        return f"the {who} agent is measured under {', '.join(ENGINE_FAULTS)}"
    if spec.scenarios and scenario not in spec.scenarios:
        return f"the {who} agent's tools play the {', '.join(spec.scenarios)} story only, not {scenario}"
    return None


def episode_costs(run: AgentRun, wall_s: float, spent=None) -> dict[str, float]:
    """What one episode cost, per tool call the model made: ``{"tool_calls": n, "wall_ms_per_call": ...,
    "round_trips_per_call": ..., "connections": ...}`` (wall time of the whole episode in milliseconds, process
    starts and engine launches included; round trips and connections only when ``spent``, a
    :class:`agentlab.lab.roundtrips.Tally` of the agent's own connections, is given: the statements' round trips,
    logins apart). ``{}`` when the model made no tool call."""
    from langchain_core.messages import AIMessage

    calls = sum(len(m.tool_calls) for m in run.messages if isinstance(m, AIMessage))
    if calls == 0:
        return {}
    out = {"tool_calls": calls, "wall_ms_per_call": round(1000 * wall_s / calls, 1)}
    if spent is not None:
        out.update(round_trips_per_call=round(spent.query_round_trips / calls, 1), connections=spent.connections)
    return out


def rebuild_name(spec: AgentSpec) -> str:
    """The name another process rebuilds ``spec`` from: its ``ref`` (``"package.module:factory"``), else its name."""
    return spec.ref or spec.name


class Yardstick:
    """Runs agents under faults on one harness's database (its domain, schema and seed data).

    Args:
        harness: the database, the provider and the events (:class:`agentlab.runtime.harness.Harness`).
        model: ``model(script, seed)`` builds the episode's chat model (default: the scripted model);
            a real model (``model=lambda script, seed: load_model("openai:gpt-4o-mini")``) makes the
            scripted hallucinations ``n/a``.
    """

    def __init__(self, harness: Harness, *, model: Callable[[list, int], Any] | None = None):
        self.harness = harness
        self.make_model = model or (lambda script, seed: ScriptedChatModel(script=script, seed=seed))
        self.scripted = model is None
        self.engine_cap_s = ENGINE_CAP_S  # how long one life of a durable engine's agent may run (seconds)
        self.counter = None  # a RoundTripCounter the agent's own connections go through (run_yardstick's costs=True)
        self._installed: set[str] = set()

    @property
    def agent_url(self) -> str:
        """The database URL the agent under test connects with: the harness's, through :attr:`counter` when one
        counts round trips (the faults, the checker and the provider keep the harness's own connections)."""
        return self.counter.url(self.harness.url) if self.counter is not None else self.harness.url

    @property
    def route(self):
        """``route(conninfo) -> conninfo`` for an engine's lives: through :attr:`counter` when one counts, else None."""
        return self.counter.url if self.counter is not None else None

    async def install(self, fault: str | YardstickFault) -> None:
        """Install ``fault``'s database objects on the harness once (an episode's :meth:`run` does it when it is
        the fault's first): call it before episodes of one fault run at the same time, so none races another."""
        yf = get_yardstick_fault(fault) if isinstance(fault, str) else fault
        if yf.name not in self._installed:
            await yf.fault.install(self.harness.pool)
            self._installed.add(yf.name)

    async def run(self, agent, fault: str | YardstickFault = "none", *, seed: int = 0,
                  scenario: str | None = None, durability: str | None = None, alone: bool = True) -> AgentRun:
        """One episode of ``agent`` (see :func:`agentlab.lab.agents.resolve_agent`) under ``fault``, checked.

        The scenario is the fault's, chosen by ``seed`` as the failure lab chooses it (so every agent
        plays the same episode for one seed). Returns the :class:`AgentRun` (``status`` ``"n/a"`` with
        its ``reason`` when the fault cannot apply to the agent). ``durability`` is LangGraph's (``"sync"``,
        ``"async"``, ``"exit"``; default ``"sync"`` when the fault resumes the thread, else ``"async"``).
        A fault with ``process_death`` runs every life of the agent in a child process
        (:class:`agentlab.lab.clients.process_death.ChildProcessClient`): the agent must be one a name
        rebuilds there (``toolnode``, ``create_agent``, ``kit:PRESET``, ``package.module:factory``).
        ``alone``: False when other episodes run at the same time; the round trips of :attr:`counter` are then
        not counted for this one (the counter sees theirs too), the wall time still is.

        Raises:
            ValueError: an unknown fault or scenario.
            agentlab.core.errors.AgentlabError: an agent that does not load.
        """
        spec = resolve_agent(agent)
        yf = get_yardstick_fault(fault) if isinstance(fault, str) else fault
        h = self.harness
        h.check_open()
        name, rng = scenarios.choose(h, yf.fault, seed=seed, scenario=scenario, name=yf.name)
        sc = scenarios.prepared(h, yf.fault, name, rng)
        out = AgentRun(spec.name, yf.name, sc, seed, harness=h)
        why = yf.not_applicable(spec, scripted_model=self.scripted)
        if why is None and spec.engine is not None:
            why = _engine_cannot_play(spec, yf, sc.name, scripted_model=self.scripted)
        elif why is None and getattr(yf.fault, "process_death", False):
            why = _rebuilt_by_name(spec, scripted_model=self.scripted)
        if why is not None:
            out.status, out.reason = NA, why
            return out
        await self.install(yf)
        if isinstance(yf.fault, Concurrent):
            from agentlab.lab.yardstick_concurrency import run_two

            return await run_two(self, spec, yf.fault, out)
        sg = yf.fault.episode_safeguards(spec.checked_as) if spec.safeguards is not None else spec.checked_as
        out.safeguards, out.outbox = sg, sg.outbox
        out.thread_id = f"{spec.name.replace(':', '-')}-{yf.name}-{uuid.uuid4().hex[:12]}"
        async with h.pool.connection() as conn:
            out.customer_ids = await h.domain.create_rows(conn, sc, sg.schema)
        out.network_provider = NetworkProvider(h.provider)
        out.worker = OutboxWorker(h.pool, out.network_provider, thread_id=out.thread_id)
        script = rename_script(sc.script(out.customer_ids), dict(spec.tool_names))
        config = {"configurable": {"thread_id": out.thread_id, "tenant_id": sc.tenant_id}}
        if spec.safeguards is not None:
            from agentlab.core.graph import run_config

            config = run_config(out.thread_id, tenant_id=sc.tenant_id)
        durability = durability or ("sync" if yf.fault.resumes else "async")
        out.notes["durability"] = durability
        cap_s = min(self.engine_cap_s, STUCK_RETRY_CAP_S) if yf.name == "stuck_retry" else self.engine_cap_s
        if spec.engine == "dbos":  # a durable engine's agent, each life a process of its own
            client = DbosClient(spec, out, shape=spec.name.split(":", 1)[1], script=script,
                                crash=bool(getattr(yf.fault, "process_death", False)), cap_s=cap_s, route=self.route)
        elif spec.engine == "pydantic_ai":  # Pydantic AI's durable agent on DBOS: DBOS's lives, another app
            client = DbosClient(spec, out, shape="steps", script=script,
                                crash=bool(getattr(yf.fault, "process_death", False)), cap_s=cap_s,
                                app=PYDANTIC_AI_APP, measured=("pydantic-ai-slim",), route=self.route)
        elif spec.engine == "temporal":  # a worker per life, on the episode's task queue of a dev server
            from agentlab.lab.clients.temporal_client import TemporalClient

            client = TemporalClient(spec, out, script=script, crash=bool(getattr(yf.fault, "process_death", False)),
                                    cap_s=cap_s, route=self.route)
        elif spec.engine == "pydantic_ai_temporal":  # Pydantic AI's durable agent on Temporal: Temporal's lives
            from agentlab.lab.clients.pydantic_ai_temporal import MEASURED, PydanticAITemporalAgent
            from agentlab.lab.clients.temporal_client import TemporalClient

            client = TemporalClient(spec, out, script=script, crash=bool(getattr(yf.fault, "process_death", False)),
                                    cap_s=cap_s, route=self.route, agent_class=PydanticAITemporalAgent,
                                    measured=MEASURED)
        elif getattr(yf.fault, "process_death", False):  # every life of the agent a process of its own
            client = ChildProcessClient(spec, out, script=script, config=config, durability=durability,
                                        fault_name=yf.name, agent_name=rebuild_name(spec))
        else:
            client = GraphAgentClient(self, spec, out, needs=yf.needs, script=script, config=config,
                                      durability=durability)
        before, t0 = (self.counter.snapshot() if self.counter is not None and alone else None), time.perf_counter()
        _, out.violations = await loop.run(client, scenarios.workload(sc, self.prompt(sc, out.customer_ids)),
                                           yf.fault, episode_checker(h.pool, sc, sg, h.domain))
        out.costs = episode_costs(out, time.perf_counter() - t0, self.counter.snapshot() - before if before else None)
        return out

    def prompt(self, scenario, customer_ids: list[int]) -> str:
        """The user's message: the scenario's prompt; for a real model, followed by the ids the episode
        created (:func:`agentlab.runtime.models.prompt_for_model`), which a real model cannot guess."""
        return scenario.prompt if self.scripted else prompt_for_model(scenario, customer_ids)

    async def open_process(self, processes: list) -> EpisodeProcess:
        """A new agent process of the episode on the harness's database, appended to ``processes``."""
        p = await EpisodeProcess(self.agent_url).open()
        processes.append(p)
        return p

    def build(self, spec: AgentSpec, process: EpisodeProcess, script, seed: int, run: AgentRun, *, pool=None):
        """``spec``'s graph in ``process`` (on ``pool``, default the process's), its model playing ``script``;
        ``run.node`` is the tools step the build exposed (None when it exposes none)."""
        return build_agent(spec, process, self.make_model(script, seed), run, self.harness.domain,
                           self.harness.events, pool=pool)

    async def quiet(self, before: set) -> None:
        """Wait for the work the agent left running (:func:`agentlab.lab.clients.agent_process.quiet`)."""
        await quiet(before)
