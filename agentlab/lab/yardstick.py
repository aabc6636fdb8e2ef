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
===========================  ===========================================================================

A fault that cannot apply to an agent (a hook it does not expose, a hallucination a real model would
not make on cue) gives the cell ``n/a`` with the reason, never a pass. :data:`YARDSTICK_FAULTS` is the
registry; :func:`register_fault` adds a fault (a family built elsewhere plugs in here).

Episodes run one at a time, each agent process with its own pools and saver, and the episode ends
only when the work the agent left running (a ``ToolNode`` sibling still in flight when another call
raised) has finished: so the same seed gives the same table.

``await run_yardstick(["toolnode", "create_agent", "kit"])`` returns a :class:`YardstickResult`;
``python -m agentlab chaos --agent toolnode create_agent kit`` prints it.

Sources: LangGraph docs "Persistence" (resuming a thread with ``None``), "ToolNode" (its error
handling); LangChain docs "Agents" (``create_agent``); PostgreSQL "pg_terminate_backend", "pg_locks".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
import psycopg
from psycopg_pool import AsyncConnectionPool

from agentlab.core.errors import SimulatedCrash
from agentlab.core.outbox import OutboxWorker
from agentlab.core.safeguards import preset
from agentlab.lab.agents import AgentContext, AgentSpec, resolve_agent
from agentlab.lab.faults import (
    SLOW_ARM, SLOW_DISARM, WAIT_CAP_S, POLL_S, TERMINATE, Fault, SlowStatement, fault_scenarios, get_fault,
)
from agentlab.lab.invariants import KINDS, check_episode
from agentlab.lab.runner import CrashableSaver
from agentlab.runtime.harness import POOL_TIMEOUT_S, Episode, Harness, checkpointer_pool
from agentlab.sim.model import ScriptedChatModel

NA = "n/a"
QUIET_CAP_S = 5.0  # how long an episode waits for the work its agent left running
PROVIDER_LATENCY_S = 0.05  # the payment request's trip to the provider, before it does the work


class NetworkProvider:
    """The payment provider across a network: a request travels ``latency_s`` seconds before the provider
    performs it (a real provider answers in tens to hundreds of milliseconds), then goes through a
    :class:`Wire` of its own (performed in the order sent, answered in that order). It fixes the order of
    what races a payment in flight (a sibling call's error cancelling it), so the same seed gives the
    same table."""

    def __init__(self, provider, latency_s: float = PROVIDER_LATENCY_S):
        self._provider, self.latency_s = provider, latency_s
        self.wire = Wire()

    def __getattr__(self, name):
        return getattr(self._provider, name)

    async def create_charge(self, *args, **kwargs) -> dict:
        await asyncio.sleep(self.latency_s)
        return await self.wire.carry(lambda: self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        await asyncio.sleep(self.latency_s)
        return await self.wire.carry(lambda: self._provider.create_refund(*args, **kwargs))


# --------------------------------------------------------------------------- faults without a hook

SLOW_PID = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242 AND objid = %s AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
)


@dataclass(frozen=True)
class KillDuringStatement(SlowStatement):
    """While the agent's UPDATE of the episode's first customer runs (held by the statement trigger of
    ``statement_timeout``, which marks it in ``pg_locks``), another connection terminates that backend
    (``pg_terminate_backend``): the agent's statement meets a dead connection, whatever its code."""

    def episode_safeguards(self, safeguards):
        return safeguards

    async def arm(self, run) -> None:
        await self.install(run.pool)
        customer = run.customer_ids[0]
        async with run.pool.connection() as conn:
            await conn.execute(SLOW_ARM, (customer,))

        async def control() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_CAP_S
            try:
                while loop.time() < deadline:
                    async with run.pool.connection() as conn:
                        row = await (await conn.execute(SLOW_PID, (customer,))).fetchone()
                        if row is not None:
                            done = (await (await conn.execute(TERMINATE, (row[0],))).fetchone())[0]
                            run.notes["killed_pid"], run.notes["terminated"] = row[0], bool(done)
                            return
                    await asyncio.sleep(POLL_S)
            finally:
                with contextlib.suppress(Exception):
                    async with run.pool.connection() as conn:
                        await conn.execute(SLOW_DISARM, (customer,))

        run.background.append(asyncio.create_task(control()))


@dataclass(frozen=True)
class CrashAtCheckpoint(Fault):
    """The process dies once the first tools step's ToolMessages reach the checkpointer, before they
    are written (the tools' effects are committed; the checkpoint is not); a new process resumes."""

    resumes = True

    async def arm(self, run) -> None:
        run.saver.crash_at_tool_writes.add(run.thread_id)


@dataclass(frozen=True)
class CrashAfterPayment(Fault):
    """The process that calls the provider dies after the provider did the work: the outbox worker for
    an agent with the kit's outbox, else the agent's process (its provider answers, then it dies)."""

    forget_keys: bool = False
    scenarios: tuple[str, ...] = ("refund", "invoice", "topup", "batch")
    resumes = True

    async def arm(self, run) -> None:
        if run.outbox:
            def die(row_id: int) -> None:
                if not run.notes.get("crashes"):
                    run.notes.setdefault("crashes", []).append("worker, after the provider call")
                    raise SimulatedCrash(f"simulated worker crash after the provider call (row {row_id})")

            run.worker.hooks.after_provider_call.append(die)
        else:
            run.agent_provider = _DiesAfterPayment(run.network_provider, run)

    async def before_restart(self, run) -> None:
        if self.forget_keys:
            run.provider.clock.advance(run.provider.retention_s + 2 * 86400)


class _DiesAfterPayment:
    """The provider as the agent's process sees it: the process dies once a payment call has returned."""

    def __init__(self, provider, run):
        self._provider, self._run = provider, run

    def __getattr__(self, name):
        return getattr(self._provider, name)

    async def _after(self, response: dict) -> dict:
        if not self._run.notes.get("crashes"):
            raise self._run.crash("after the provider call")
        return response

    async def create_charge(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_refund(*args, **kwargs))


@dataclass(frozen=True)
class YardstickFault:
    """A fault as the yardstick applies it: ``fault`` (its phases), ``needs`` (hooks the agent must
    expose, else ``n/a``), ``scripted`` (a hallucination only the scripted model makes on cue)."""

    fault: Fault
    needs: frozenset[str] = frozenset()
    scripted: bool = False

    @property
    def name(self) -> str:
        return self.fault.name

    def not_applicable(self, agent: AgentSpec, *, scripted_model: bool) -> str | None:
        """Why this fault cannot apply to ``agent`` (one line), or None when it applies."""
        missing = sorted(self.needs - agent.exposes)
        if missing:
            return f"needs a hook inside the agent's tools step ({', '.join(missing)}), which {agent.name} does not expose"
        if self.scripted and not scripted_model:
            return "a hallucinated argument is scripted; a real model's arguments are its own"
        return None


@dataclass(frozen=True)
class AsScripted(Fault):
    """The scenario as its script has it, hallucination included (refund: the customer id of the refund
    sent as text with a stray quote, ``"12'"``): the kit's seed story."""

    def prepare(self, scenario, rng: random.Random):
        from agentlab.domains.billing.scenarios import get_scenario

        return get_scenario(scenario.name)


_SCRIPTED = ("wrong_type", "negative_amount", "stray_quote", "other_tenant_id", "check_violation",
             "unique_violation", "fk_violation", "wrong_order")
YARDSTICK_FAULTS: dict[str, YardstickFault] = {
    "none": YardstickFault(get_fault("none")),
    "refund_story": YardstickFault(AsScripted(
        "refund_story", "hallucinated_argument", "the refund story as scripted: the refund's customer id arrives "
        "as \"12'\"; the model resends what it cannot tell was applied", "validation", ("refund",)), scripted=True),
    **{name: YardstickFault(get_fault(name), scripted=True) for name in _SCRIPTED},
    "lock_timeout": YardstickFault(get_fault("lock_timeout")),
    "statement_timeout": YardstickFault(get_fault("statement_timeout")),
    "backend_killed": YardstickFault(KillDuringStatement(
        "backend_killed", "backend_killed", "pg_terminate_backend from another connection during the customer's "
        "UPDATE", "transaction")),
    "crash_before_checkpoint": YardstickFault(CrashAtCheckpoint(
        "crash_before_checkpoint", "crash_before_checkpoint", "crash after the tools step, before its checkpoint; "
        "resume in a new process", "ledger")),
    "crash_mid_node": YardstickFault(get_fault("crash_mid_node"), needs=frozenset({"node_hooks"})),
    "provider_timeout": YardstickFault(get_fault("provider_timeout")),
    "worker_crash": YardstickFault(CrashAfterPayment(
        "worker_crash", "worker_crash", "the caller of the provider dies after the call, before recording it",
        "outbox")),
}
"""The faults the yardstick runs, in table order."""


def register_fault(fault: Fault, *, needs: Iterable[str] = (), scripted: bool = False) -> None:
    """Add ``fault`` (a :class:`agentlab.lab.faults.Fault`: ``prepare``, ``arm``, ``before_restart``,
    ``disarm`` on the episode's :class:`AgentRun`) to :data:`YARDSTICK_FAULTS`; ``needs`` names the hooks
    an agent must expose for it (else its cell is ``n/a``). Raises ValueError if the name is taken."""
    if fault.name in YARDSTICK_FAULTS:
        raise ValueError(f"the yardstick already has a fault named {fault.name!r}")
    YARDSTICK_FAULTS[fault.name] = YardstickFault(fault, frozenset(needs), scripted)


def get_yardstick_fault(name: str) -> YardstickFault:
    """The named fault. Raises ValueError naming the known ones."""
    try:
        return YARDSTICK_FAULTS[name]
    except KeyError:
        raise ValueError(f"the yardstick has no fault {name!r}; choose one of: {', '.join(YARDSTICK_FAULTS)}") from None


# --------------------------------------------------------------------------- one agent process

class YardstickSaver(CrashableSaver):
    """The real ``AsyncPostgresSaver`` (via :class:`agentlab.lab.runner.CrashableSaver`), where the
    process can die on the way in: once a thread in :attr:`crash_at_tool_writes` hands it writes that
    carry ToolMessages, the thread is dead in this process (nothing more is written for it) and
    :class:`SimulatedCrash` is raised."""

    def __init__(self, conn, **kwargs):
        super().__init__(conn, **kwargs)
        self.crash_at_tool_writes: set[str] = set()
        self.crashed_here: set[str] = set()

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        thread_id = config["configurable"]["thread_id"]
        if thread_id in self.crash_at_tool_writes and any(_has_tool_message(v) for _, v in writes):
            self.crash_at_tool_writes.discard(thread_id)
            self.kill(thread_id)
            self.crashed_here.add(thread_id)
        if thread_id in self.crashed_here:
            raise self._crash(thread_id)
        return await super().aput_writes(config, writes, task_id, task_path)

    async def aput(self, config, checkpoint, metadata, new_versions):
        # LangGraph hands writes to the saver in the background; the step's checkpoint (awaited before
        # the next step under durability "sync") is where the dead process stops for certain
        if config["configurable"]["thread_id"] in self.crashed_here:
            raise self._crash(config["configurable"]["thread_id"])
        return await super().aput(config, checkpoint, metadata, new_versions)

    def _crash(self, thread_id: str) -> SimulatedCrash:
        return SimulatedCrash(f"simulated process crash after the tools step, before its checkpoint (thread {thread_id})")


def _has_tool_message(value: Any) -> bool:
    if isinstance(value, ToolMessage):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, ToolMessage) for v in value)


DB_LATENCY_S = 0.02  # an answer from PostgreSQL reaches the agent this long after the server finished
ORDER_WAIT_S = 0.05  # a statement waits at most this long for the one sent before it (then goes anyway)


class Wire:
    """The network between an agent process and PostgreSQL, as the lab fixes it.

    Statements sent concurrently (``ToolNode``'s sibling calls, ``create_agent``'s tasks) reach the
    server in the order they were sent, each once the one before it has finished (or after
    ``order_wait_s``, so that a statement blocked on a lock holds none of its siblings for long); an
    answer arrives ``latency_s`` seconds after the server finished, answers in the order sent. So every
    call of a batch has reached the server before the agent reads the first answer, and the first
    failure it reads is the first call's: the order of events, hence the table, is the same on every
    run. The real world lets these race (which sibling commits before an error cancels the rest); the
    lab shows one fixed order of them, the one the calls were sent in."""

    def __init__(self, latency_s: float = DB_LATENCY_S, order_wait_s: float = ORDER_WAIT_S):
        self.latency_s, self.order_wait_s = latency_s, order_wait_s
        self._ran: asyncio.Future | None = None
        self._answered: asyncio.Future | None = None

    async def carry(self, send: Callable[[], Any]):
        """Run ``send()`` (a psycopg ``execute``) in order, then deliver its answer in order."""
        loop = asyncio.get_running_loop()
        ran_before, answered_before = self._ran, self._answered
        self._ran = ran = loop.create_future()
        self._answered = answered = loop.create_future()
        try:
            if ran_before is not None and not ran_before.done():
                await asyncio.wait([ran_before], timeout=self.order_wait_s)
            try:
                return await send()
            finally:
                ran.done() or ran.set_result(None)
                await asyncio.sleep(self.latency_s)
                if answered_before is not None and not answered_before.done():
                    await asyncio.wait([answered_before], timeout=self.order_wait_s)
        finally:
            ran.done() or ran.set_result(None)
            answered.done() or answered.set_result(None)


class WiredConnection(psycopg.AsyncConnection):
    """A psycopg connection whose ``execute`` goes through the process's :class:`Wire`."""

    wire: Wire | None = None

    async def execute(self, query, params=None, *, prepare=None, binary=False):
        def send():
            return super(WiredConnection, self).execute(query, params, prepare=prepare, binary=binary)

        return await (self.wire.carry(send) if self.wire is not None else send())


class AgentProcess:
    """One agent process of an episode: its own autocommit pool (psycopg_pool's default size, four
    connections, as a user opens one: ``AsyncConnectionPool(url, kwargs={"autocommit": True})``),
    its checkpointer pool and saver."""

    def __init__(self, url: str):
        self.wire = Wire()
        self.pool = AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False,
                                        connection_class=WiredConnection, configure=self._configure)
        self.checkpointer_pool = checkpointer_pool(url, max_size=2)
        self.saver: YardstickSaver | None = None

    async def _configure(self, conn) -> None:
        conn.wire = self.wire

    async def open(self) -> "AgentProcess":
        try:
            await self.pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            await self.checkpointer_pool.open(wait=True, timeout=POOL_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise
        self.saver = YardstickSaver(self.checkpointer_pool)
        return self

    async def close(self) -> None:
        await self.checkpointer_pool.close()
        await self.pool.close()


# --------------------------------------------------------------------------- one episode

@dataclass
class AgentRun:
    """One episode of one agent under one fault: what a fault acts on while it runs, and the outcome.

    ``pool`` is the harness's (another session: the lock holder, the killer); ``saver``, ``node`` and
    ``worker`` are the episode's own. ``raised`` names what the agent's run raised (``None``: it ended).
    ``status`` is ``"ran"`` or ``"n/a"`` (``reason`` says why)."""

    agent: str
    fault: str
    scenario: Any = None
    seed: int = 0
    status: str = "ran"
    reason: str = ""
    thread_id: str = ""
    customer_ids: list[int] = field(default_factory=list)
    safeguards: Any = None
    raised: str | None = None
    crashed: bool = False
    violations: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    harness: Any = None
    saver: Any = None
    node: Any = None
    worker: Any = None
    agent_provider: Any = None
    network_provider: Any = None
    outbox: bool = False
    background: list = field(default_factory=list)

    @property
    def pool(self):
        return self.harness.pool

    @property
    def provider(self):
        return self.harness.provider

    @property
    def schema(self) -> str:
        return self.safeguards.schema

    def crash(self, where: str) -> SimulatedCrash:
        """The process dies here: its saver writes nothing more for this thread. Raise the result."""
        self.saver.kill(self.thread_id)
        self.notes.setdefault("crashes", []).append(where)
        return SimulatedCrash(f"simulated process crash {where} (thread {self.thread_id})")

    def counts(self) -> dict[str, int]:
        """Violations by kind (every kind of :data:`agentlab.lab.invariants.KINDS`, then a domain's own)."""
        c = Counter(v.kind for v in self.violations)
        return {**{k: c.get(k, 0) for k in KINDS}, **{k: n for k, n in c.items() if k not in KINDS}}


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


def _leftover_tasks(before: set) -> set:
    """Tasks started since ``before`` that belong to the agent (not a pool's own workers)."""
    current = asyncio.current_task()
    out = set()
    for t in asyncio.all_tasks() - before:
        if t is current or t.done():
            continue
        coro = t.get_coro()
        code = getattr(coro, "cr_code", None)
        if code is not None and "psycopg_pool" in code.co_filename:
            continue
        if getattr(coro, "__qualname__", "") == "Event.wait":
            continue  # a timed wait inside a pool's scheduler (asyncio.wait_for's own task), not work
        out.add(t)
    return out


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
        self._installed: set[str] = set()

    async def run(self, agent, fault: str | YardstickFault = "none", *, seed: int = 0,
                  scenario: str | None = None) -> AgentRun:
        """One episode of ``agent`` (see :func:`agentlab.lab.agents.resolve_agent`) under ``fault``, checked.

        The scenario is the fault's, chosen by ``seed`` as the failure lab chooses it (so every agent
        plays the same episode for one seed). Returns the :class:`AgentRun` (``status`` ``"n/a"`` with
        its ``reason`` when the fault cannot apply to the agent).

        Raises:
            ValueError: an unknown fault or scenario.
            agentlab.core.errors.AgentlabError: an agent that does not load.
        """
        spec = resolve_agent(agent)
        yf = get_yardstick_fault(fault) if isinstance(fault, str) else fault
        h = self.harness
        h.check_open()
        rng = random.Random(f"{seed}:{yf.name}")
        name = scenario or rng.choice(fault_scenarios(yf.fault, h.domain))
        sc = yf.fault.prepare(h.scenario(name).clean(), rng)
        out = AgentRun(spec.name, yf.name, sc, seed, harness=h)
        why = yf.not_applicable(spec, scripted_model=self.scripted)
        if why is not None:
            out.status, out.reason = NA, why
            return out
        if yf.name not in self._installed:
            await yf.fault.install(h.pool)
            self._installed.add(yf.name)
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
        durability = "sync" if yf.fault.resumes else "async"
        before = set(asyncio.all_tasks())
        processes: list[AgentProcess] = []
        state: dict | None = None
        try:
            process = await self._process(processes)
            out.saver = process.saver
            if "node_hooks" not in yf.needs:
                await yf.fault.arm(out)  # before the build: a fault may change the provider the agent gets
            graph = self._build(spec, process, script, seed, out)
            if "node_hooks" in yf.needs:
                await yf.fault.arm(out)
            try:
                state = await graph.ainvoke({"messages": [HumanMessage(sc.prompt)]}, config, durability=durability)
            except SimulatedCrash:
                out.crashed = True
            except Exception as exc:
                out.raised = _describe(exc)
            await self._quiet(before)
            if out.crashed:
                await yf.fault.before_restart(out)
                process = await self._process(processes)
                out.saver = process.saver
                out.agent_provider = None
                graph = self._build(spec, process, script, seed, out)
                try:
                    state = await graph.ainvoke(None, config, durability=durability)
                except Exception as exc:
                    out.raised = _describe(exc)
                    state = None
                await self._quiet(before)
            if state is None:
                snapshot = await graph.aget_state(config)
                state = snapshot.values if snapshot is not None else {}
            if out.outbox:
                try:
                    await out.worker.drain()
                except SimulatedCrash:
                    await yf.fault.before_restart(out)
                    await OutboxWorker(h.pool, out.network_provider, thread_id=out.thread_id).drain()
        finally:
            await yf.fault.disarm(out)
            for p in processes:
                await p.close()
        out.messages = list(state.get("messages", []))
        ep = Episode(sc.name, spec.name, out.thread_id, seed, out.customer_ids, sg.schema, sc.tenant_id,
                     messages=as_domain_messages(out.messages, dict(spec.tool_names)))
        out.violations = await check_episode(h.pool, ep, sc, sg, h.domain)
        return out

    async def _process(self, processes: list) -> AgentProcess:
        p = await AgentProcess(self.harness.url).open()
        processes.append(p)
        return p

    def _build(self, spec: AgentSpec, process: AgentProcess, script, seed: int, run: AgentRun):
        ctx = AgentContext(self.make_model(script, seed), process.pool, run.agent_provider or run.network_provider,
                           process.saver, self.harness.domain, self.harness.events,
                           safeguards=run.safeguards if spec.safeguards is not None else None)
        graph = spec.build(ctx)
        run.node = ctx.exposed.get("node")
        return graph

    async def _quiet(self, before: set) -> None:
        """Wait (at most :data:`QUIET_CAP_S`) for the work the agent left running, so that the checker
        reads an end state, not a moment of it."""
        left = _leftover_tasks(before)
        if left:
            await asyncio.wait(left, timeout=QUIET_CAP_S)


def _describe(exc: BaseException) -> str:
    """What an agent's run raised, as the table shows it: the exception's class, and the SQLSTATE when
    PostgreSQL gave one."""
    state = getattr(exc, "sqlstate", None)
    return type(exc).__name__ + (f" ({state})" if state else "")


# --------------------------------------------------------------------------- the table

ROW_COLUMNS = ("agent", "fault", "scenario", "episode", "seed", "status", "reason", "raised", "crashed", "violations")


@dataclass
class YardstickResult:
    """The yardstick's outcome: ``rows`` (a DataFrame, one row per agent, fault and episode, with
    :data:`ROW_COLUMNS` and a count per violation kind), the agents and faults in table order, the
    ``versions`` measured, and ``runs`` (the :class:`AgentRun` of each row, to trace one through)."""

    rows: Any
    agents: tuple[str, ...]
    faults: tuple[str, ...]
    seed: int
    episodes_per_cell: int
    versions: dict[str, str]
    runs: list[AgentRun] = field(default_factory=list)

    @property
    def kinds(self) -> list[str]:
        return [c for c in self.rows.columns if c not in ROW_COLUMNS]

    @property
    def summary(self):
        """Violations per fault (rows) and agent (columns); ``"n/a"`` where the fault cannot apply."""
        import pandas as pd

        table = pd.DataFrame(index=list(self.faults), columns=list(self.agents), dtype=object)
        for (fault, agent), part in self.rows.groupby(["fault", "agent"], sort=False):
            ran = part[part["status"] == "ran"]
            table.loc[fault, agent] = int(ran["violations"].sum()) if len(ran) else NA
        table.index.name, table.columns.name = "fault", "agent"
        return table

    def by_kind(self):
        """Violations per agent (rows) and kind (columns), over the faults that applied; kinds that never
        occurred are left out."""
        ran = self.rows[self.rows["status"] == "ran"]
        sums = ran.groupby("agent", sort=False)[self.kinds].sum().reindex(list(self.agents), fill_value=0)
        return sums.loc[:, (sums != 0).any(axis=0)].astype(int)

    def raised(self):
        """What each agent's run raised per fault (exception classes, ``-`` when it ended normally;
        ``crash`` marks an episode whose process died and resumed)."""
        import pandas as pd

        table = pd.DataFrame(index=list(self.faults), columns=list(self.agents), dtype=object)
        for (fault, agent), part in self.rows.groupby(["fault", "agent"], sort=False):
            if (part["status"] != "ran").all():
                table.loc[fault, agent] = NA
                continue
            seen = []
            for r in part.itertuples():
                what = ("crash, then " if r.crashed else "") + (r.raised if isinstance(r.raised, str) else "-")
                if what not in seen:
                    seen.append(what)
            table.loc[fault, agent] = "; ".join(seen)
        table.index.name, table.columns.name = "fault", "agent"
        return table

    def not_applicable(self) -> dict[tuple[str, str], str]:
        """``{(fault, agent): reason}`` for every cell that is ``n/a``."""
        na = self.rows[self.rows["status"] == NA]
        return {(r.fault, r.agent): r.reason for r in na.itertuples()}

    def deterministic_view(self):
        """The rows as two runs with one seed must give them (nothing here varies with the clock)."""
        return self.rows.reset_index(drop=True)

    def run_of(self, agent: str, fault: str, episode: int = 0) -> AgentRun:
        """The :class:`AgentRun` of one cell's episode. Raises KeyError when there is none."""
        for r, run in zip(self.rows.itertuples(), self.runs):
            if r.agent == agent and r.fault == fault and r.episode == episode:
                return run
        raise KeyError((agent, fault, episode))

    def to_json(self) -> dict[str, Any]:
        """``versions``, ``seed``, ``episodes_per_cell``, ``summary`` (``{agent: {fault: n or "n/a"}}``),
        ``raised`` (same shape, text), ``not_applicable`` (``{agent: {fault: reason}}``) and ``rows``."""
        summary, raised = self.summary, self.raised()
        na: dict[str, dict[str, str]] = {}
        for (fault, agent), reason in self.not_applicable().items():
            na.setdefault(agent, {})[fault] = reason
        return {"versions": self.versions, "seed": self.seed, "episodes_per_cell": self.episodes_per_cell,
                "summary": {a: {f: summary.loc[f, a] for f in self.faults} for a in self.agents},
                "raised": {a: {f: raised.loc[f, a] for f in self.faults} for a in self.agents},
                "not_applicable": na,
                "rows": [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                         for r in self.rows.to_dict(orient="records")]}


def versions() -> dict[str, str]:
    """The installed versions the table was measured with (LangGraph, its prebuilt agents, LangChain,
    the checkpointer, psycopg)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("langgraph", "langgraph-prebuilt", "langchain", "langchain-core", "langgraph-checkpoint-postgres",
                    "psycopg"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def _row(run: AgentRun, episode: int) -> dict[str, Any]:
    return {"agent": run.agent, "fault": run.fault, "scenario": run.scenario.name if run.scenario else None,
            "episode": episode, "seed": run.seed, "status": run.status, "reason": run.reason, "raised": run.raised,
            "crashed": run.crashed, "violations": len(run.violations), **run.counts()}


async def run_yardstick(agents: Iterable = ("toolnode", "create_agent", "kit"), faults: Iterable[str] | None = None,
                        *, episodes: int = 1, seed: int = 0, url: str | None = None, domain=None,
                        model: Callable[[list, int], Any] | None = None) -> YardstickResult:
    """Run every agent under every fault, ``episodes`` episodes per cell, on one fresh database.

    Args:
        agents: agents as :func:`agentlab.lab.agents.resolve_agent` takes them (names, specs, factories).
        faults: names from :data:`YARDSTICK_FAULTS` (default: all, in its order).
        episodes: episodes per cell; episode ``i`` has the seed :func:`agentlab.lab.experiments.episode_seed`
            gives, the same for every agent and fault.
        url: run on this database (default: a fresh one of ``domain``, dropped afterwards).
        domain: the domain (default billing; the baselines' tools are billing's).
        model: ``model(script, seed)`` builds each episode's chat model (default: the scripted model).

    Raises:
        ValueError: an unknown fault, one given twice, or ``episodes`` below 1.
        agentlab.core.errors.AgentlabError: an agent that does not load.
        agentlab.runtime.db.DatabaseUnavailable: no server.
    """
    from agentlab.lab.experiments import episode_seed

    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    specs = [resolve_agent(a) for a in agents]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"two agents share a name ({', '.join(names)}); give each its own")
    faults = tuple(faults or YARDSTICK_FAULTS)
    if len(set(faults)) != len(faults):
        raise ValueError("a fault is given more than once; name each fault once")
    chosen = [get_yardstick_fault(f) for f in faults]
    import pandas as pd

    h = await Harness.open(url, purpose="yardstick", domain=domain)
    ys = Yardstick(h, model=model)
    rows, runs = [], []
    try:
        for yf in chosen:
            for spec in specs:
                for i in range(episodes):
                    run = await h.watched(ys.run(spec, yf, seed=episode_seed(seed, i)))
                    rows.append(_row(run, i))
                    runs.append(run)
    finally:
        await h.close()
    frame = pd.DataFrame(rows)
    kinds = [c for c in frame.columns if c not in ROW_COLUMNS]
    frame[kinds] = frame[kinds].fillna(0).astype(int)
    frame["raised"] = frame["raised"].astype(object).where(frame["raised"].notna(), None)
    return YardstickResult(frame, tuple(names), faults, seed, episodes, versions(), runs)


def render(result: YardstickResult) -> str:
    """The CLI's text: violations per fault and agent, violations by kind per agent, what each raised,
    why a cell is n/a, and the versions measured."""
    v = result.versions
    lines = [f"The same faults, side by side: invariant violations per fault (rows) and agent (columns); "
             f"{result.episodes_per_cell} episode(s) per cell, seed {result.seed}",
             f"measured with langgraph {v['langgraph']}, langgraph-prebuilt {v['langgraph-prebuilt']}, "
             f"langchain {v['langchain']}, langgraph-checkpoint-postgres {v['langgraph-checkpoint-postgres']}", "",
             result.summary.to_string(), "", "Violations by kind (faults that applied):", "",
             result.by_kind().to_string() if len(result.by_kind().columns) else "(none)", "",
             "What each run raised (- : it ended normally):", "", result.raised().to_string()]
    na = result.not_applicable()
    if na:
        lines += ["", "n/a (the fault cannot apply to that agent; never counted as a pass):"]
        reasons: dict[str, list[str]] = {}
        for (fault, agent), reason in na.items():
            reasons.setdefault(reason, []).append(f"{fault} x {agent}")
        lines += [f"  {', '.join(cells)}: {reason}" for reason, cells in reasons.items()]
    return "\n".join(lines)


def main(args) -> int:
    """``python -m agentlab chaos --agent ...``: run the yardstick and print its table (or JSON)."""
    import json
    import logging
    import sys

    from agentlab.core.errors import AgentlabError

    for name in ("psycopg", "psycopg.pool"):  # killed backends and cancelled siblings are the point here
        logging.getLogger(name).setLevel(logging.CRITICAL)
    agents: list[Any] = []
    try:
        for a in args.agent:
            if a == "kit":
                agents += [f"kit:{p}" for p in (args.presets or ["full"])]
            else:
                agents.append(resolve_agent(a))
        faults = args.faults or list(YARDSTICK_FAULTS)
        for f in faults:
            get_yardstick_fault(f)
        if args.domain != "billing":
            raise ValueError("the yardstick runs the billing domain (the baselines' tools are billing's); "
                             "drop --domain")
    except (AgentlabError, ValueError) as exc:
        print(f"agentlab chaos: {exc}", file=sys.stderr)
        return 2
    result = asyncio.run(run_yardstick(agents, faults, episodes=args.episodes, seed=args.seed))
    print(json.dumps(result.to_json(), default=str) if args.json else render(result), flush=True)
    return 0
