"""One database and everything a run needs on it: pools, checkpointer, provider, outbox worker, events.

``async with await Harness.open(purpose="demo") as h:`` creates a fresh database (dropped on close unless
``keep=True``), opens a business pool (autocommit connections; the node opens its own transaction
blocks), an agent pool that logs in as the least-privilege agent role itself, for the nodes of isolating
presets (:meth:`Harness.pool_for`, case C45), a separate checkpointer pool (autocommit, ``dict_row``, prepared statements off behind a
transaction-mode pooler: case C11) with the checkpointer set up once (:class:`agentlab.core.checkpoints.
RetryingSaver`), the fake payment provider and the fake notification sink on pools of their own, the
outbox worker and the event log. Every pool hands out live connections in their default session state
(:mod:`agentlab.core.pools`, cases C44 and C46).
:meth:`Harness.run_episode` plays a scenario under a preset and returns an :class:`Episode`;
:meth:`Harness.end_state` reads what the database and the provider hold for it::

    async with await Harness.open(purpose="demo") as h:     # or h = await Harness.open(); ...; await h.close()
        episode = await h.run_episode("refund", "full")
        state = await h.end_state(episode)                  # {"customers": [{"final_credit_cents": ..., ...}]}

The pools by role are :mod:`agentlab.runtime.connections`'; the watch over the server (``ensure_reachable``,
``watched``, ``watch_server``, ``restart_server``) is :class:`agentlab.runtime.watch.ServerWatch`, the base class
of :class:`Harness`. Their names stay importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from langchain_core.messages import HumanMessage, ToolMessage
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from agentlab.core.batch import TransactionalToolsNode
from agentlab.core.checkpoints import RetryingSaver
from agentlab.core.domain import Domain
from agentlab.core.errors import AgentlabError, is_infrastructure
from agentlab.core.events import EventLog
from agentlab.core.graph import build_graph, run_config
from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.core.run_lock import ThreadBusy, invoke_with_lease
from agentlab.core.safeguards import Safeguards, preset
from agentlab.runtime import connections, db
from agentlab.runtime.connections import (
    POOL_TIMEOUT_S,
    AgentLoginRefused,
    agent_login_refused,
    agent_pool,
    checkpointer_pool,
    tools_pool,
)
from agentlab.runtime.domains import resolve_domain
from agentlab.runtime.models import describe_model_error, prompt_for_model
from agentlab.runtime.watch import WATCH_INTERVAL_S, ServerWatch
from agentlab.sim.model import ScriptedChatModel
from agentlab.sim.notifier import FakeNotifier
from agentlab.sim.provider import Clock, FakePaymentProvider, customer_ref

# the pools and the watch have homes of their own (issue 26); their names stay importable from here
__all__ = [
    "POOL_TIMEOUT_S", "WATCH_INTERVAL_S", "AgentLoginRefused", "Episode", "Harness", "HarnessClosed",
    "ServerWatch", "agent_login_refused", "agent_pool", "checkpointer_pool", "tools_pool",
]


class HarnessClosed(AgentlabError, RuntimeError):
    """A closed :class:`Harness` was asked to run something; the message names its database."""


@dataclass
class Episode:
    """One scenario run to its end (or to escalation, or to an error)."""

    scenario: str
    preset: str
    thread_id: str
    seed: int
    customer_ids: list[int]
    schema: str
    tenant_id: str
    messages: list = field(default_factory=list)
    rollbacks_total: int = 0
    escalated: bool = False
    error: str | None = None
    wall_ms: float = 0.0
    drain: DrainStats | None = None

    @property
    def tool_messages(self) -> list[ToolMessage]:
        return [m for m in self.messages if isinstance(m, ToolMessage)]

    @property
    def unanswered(self) -> list[str]:
        return unanswered_tool_calls(self.messages)


class Harness(ServerWatch):
    """Resources on one database. Build with :meth:`open`; close with ``await h.close()`` or ``async with``."""

    def __init__(self, url: str, *, owns_database: bool, keep: bool = False, behind_pooler: bool = False,
                 pool_max: int = 8, clock: Clock | None = None, domain: Domain | str | None = None):
        self.domain = resolve_domain(domain)
        self.url = url
        self.owns_database = owns_database
        self.keep = keep
        self.pool = tools_pool(url, behind_pooler=behind_pooler, max_size=pool_max)
        self.agent_pool = agent_pool(url, behind_pooler=behind_pooler, max_size=pool_max)
        self.agent_login_refused: str | None = None  # why the agent role cannot log in, found by open()
        self.checkpointer_pool = checkpointer_pool(url, behind_pooler=behind_pooler)
        self.saver: RetryingSaver | None = None
        self.behind_pooler = behind_pooler
        self.provider = FakePaymentProvider(url, clock=clock, behind_pooler=behind_pooler)
        self.notifier = FakeNotifier(url, clock=self.provider.clock, behind_pooler=behind_pooler)
        self.worker = OutboxWorker(self.pool, self.provider, notifier=self.notifier)
        self.events = EventLog(self.pool)
        self.toolset = self.domain.toolset
        self.closed = False  # set by close(): the pools are closed and an owned database is dropped

    @classmethod
    async def open(cls, url: str | None = None, *, purpose: str = "run", keep: bool = False,
                   behind_pooler: bool = False, pool_max: int = 8, clock: Clock | None = None,
                   domain: Domain | str | None = None) -> Harness:
        """Open on ``url``, or on a fresh database made for ``purpose`` (dropped on close unless ``keep``),
        for ``domain`` (a :class:`agentlab.core.domain.Domain`, a name such as ``"billing"``, the default,
        or ``"package.module:NAME"``): its tools, scenarios and, in a fresh database, its schema and seed.

        Raises:
            agentlab.runtime.db.DatabaseUnavailable: no server.
        """
        owns = url is None
        if owns:
            url = await asyncio.to_thread(db.create_database, purpose, resolve_domain(domain))
        h = cls(url, owns_database=owns, keep=keep, behind_pooler=behind_pooler, pool_max=pool_max, clock=clock,
                domain=domain)
        try:
            await h.ensure_reachable()  # a server that is gone fails here at once, not after the pools' wait
            await h.watched(h._open_pools())
            h.saver = RetryingSaver(conn=h.checkpointer_pool)  # a write cut by a server restart is written again
            await h.saver.setup()
            await h.provider.open()
        except BaseException as exc:  # failed or cancelled: no pool left reconnecting, no fresh database left behind
            with contextlib.suppress(Exception):
                await h.close()
            if isinstance(exc, psycopg.errors.InsufficientPrivilege):  # a right the role lacks (case C51)
                raise db.DatabaseUnavailable(db.missing_right(exc, f"opening {db.dbname_of(url)}")) from exc
            raise
        return h

    async def _open_pools(self) -> None:
        try:
            await self.pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            await self.checkpointer_pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            await self.agent_pool.open()  # min_size 0: nothing to wait for
            self.agent_login_refused = await agent_login_refused(self.url)
        except PoolTimeout as exc:
            await self.ensure_reachable(exc)  # the server is gone: DatabaseUnavailable, else the timeout
            raise

    async def close(self) -> None:
        """Close the pools and the provider; drop the database if this harness made it (unless ``keep``).
        :attr:`closed` is True afterwards; a closed harness runs nothing (see :meth:`check_open`). Closing
        again does nothing (a notebook's last cell run twice)."""
        if self.closed:
            return
        self.closed = True
        await self.events.close()  # nothing to write, or (server gone) dropped at once; counted, logged
        await self.notifier.close()
        await self.provider.close()
        await self.checkpointer_pool.close()
        await self.agent_pool.close()
        await self.pool.close()
        if self.owns_database and not self.keep:
            await asyncio.to_thread(db.drop_database, self.url)

    def check_open(self) -> None:
        """Raise :class:`HarnessClosed` (at once, instead of a pool's 10 s wait) if :meth:`close` ran."""
        if self.closed:
            dropped = "was dropped with it" if self.owns_database and not self.keep else "is kept"
            raise HarnessClosed(
                f"this harness was closed (`await h.close()`, a notebook's last cell) and its database "
                f"{db.dbname_of(self.url)} {dropped}; open a new one (re-run the notebook from its first cell, "
                "or `Harness.open()`) and run again"
            )

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ building blocks

    def thread(self, name: str) -> str:
        """A new thread id for ``name``: ``"<name>-<12 hex digits>"``, different on every call, so a cell
        run twice starts a new thread instead of continuing the finished one (whose checkpoints persist).

        The suffix has the shape of :meth:`run_episode`'s own thread ids (nbval's sanitize file masks
        it as ``-THREAD``). Raises ValueError for an empty ``name``."""
        if not name:
            raise ValueError("a thread needs a name, e.g. h.thread('nb07-crash')")
        return f"{name}-{uuid.uuid4().hex[:12]}"

    def pool_for(self, safeguards: Safeguards) -> AsyncConnectionPool:
        """The pool a tools node under ``safeguards`` runs on: under isolation the agent pool, logged in as
        the agent role itself, so a tool's ``RESET ROLE`` or ``SET ROLE <owner>`` has no superuser to go
        back to (case C45); otherwise the business pool.

        Raises:
            AgentLoginRefused: isolation is on and the agent role cannot log in (the message says what to run).
        """
        return connections.pool_for(safeguards, self.pool, self.agent_pool, self.agent_login_refused)

    def node(self, safeguards: Safeguards) -> TransactionalToolsNode:
        """A tools node on this harness's provider and event log, and the pool ``safeguards`` asks for
        (:meth:`pool_for`); its ``kit_pool``, where a graph keeps the thread's lease and approval requests,
        is the business pool (:func:`agentlab.core.graph.kit_pool`). Raises :class:`AgentLoginRefused`."""
        node = TransactionalToolsNode(self.pool_for(safeguards), safeguards, toolset=self.toolset,
                                      provider=self.provider, events=self.events, error_hints=self.domain.error_hints)
        node.kit_pool = self.pool
        return node

    def graph(self, safeguards: Safeguards, model, *, checkpointer: bool = True, approval=None):
        """The compiled agent graph for ``model`` under ``safeguards``, with the Postgres checkpointer
        (and an approval step when ``approval``, an :class:`agentlab.durable.approval.ApprovalPolicy`, is given)."""
        return build_graph(model, self.node(safeguards), checkpointer=self.saver if checkpointer else None,
                           approval=approval)

    async def create_customers(self, scenario: Any, safeguards: Safeguards) -> list[int]:
        """The scenario's own rows (billing: its customers), new rows in the schema ``safeguards`` writes
        to, made by the domain's ``create_rows``; their ids in order."""
        async with self.pool.connection() as conn:
            return await self.domain.create_rows(conn, scenario, safeguards.schema)

    def scenario(self, name: Any):
        """The domain's scenario ``name`` (a scenario value is returned as is). Raises ValueError."""
        return self.domain.get_scenario(name) if isinstance(name, str) else name

    async def df(self, query: str, params: Any = ()):
        """Rows of ``query`` on this database as a pandas DataFrame (for notebooks and reports)."""
        import pandas as pd

        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            rows = await cur.fetchall()
            columns = [d.name for d in cur.description] if cur.description else []
        return pd.DataFrame(rows, columns=columns)

    # ------------------------------------------------------------------ episodes

    async def run_episode(self, scenario: Any, safeguards: Safeguards | str = "full", *, seed: int = 0,
                          thread_id: str | None = None, durability: str = "async", drain: bool = True,
                          model=None, graph=None) -> Episode:
        """Play ``scenario`` under ``safeguards`` with the scripted model, then drain the outbox.

        ``model``: another chat model (a real one: :func:`agentlab.runtime.models.load_model`) plays
        instead; it gets the prompt with the ids of the rows the episode created
        (:func:`agentlab.runtime.models.prompt_for_model`) and decides for itself, so the scenario's
        intended end state is what the script would reach, not a promise about that model.

        ``durability`` is LangGraph's: ``"sync"`` writes each super-step's checkpoint before the next
        step starts, ``"async"`` (default) while it runs, ``"exit"`` only when the run ends. ``exit``
        is the fastest and gives up resuming: a process killed mid-run leaves no checkpoint at all,
        though its committed batches stay committed, so the thread cannot be resumed
        (:func:`agentlab.durable.history.resume_thread` says so) and a re-submitted prompt brings new
        tool call ids the ledger cannot recognise. Natural keys then refuse a second credit memo,
        refund or invoice; a call without one (``ApplyCredit``) can apply again (case C23). Choose
        ``exit`` for runs whose crash you would answer by starting over on fresh data.

        Errors that escape the graph (for example an infrastructure error past the retries) are
        recorded in :attr:`Episode.error`, not raised: an experiment goes on; so is the ``MODEL ERROR``
        of a run whose model replies could not be read (the state's ``model_error``, case C47).

        Under ``safeguards.run_lock`` the run holds the thread's lease from its start to its end
        (:mod:`agentlab.core.run_lock`): a second run on the same thread meanwhile is refused.

        Raises:
            HarnessClosed: the harness was closed.
            agentlab.runtime.db.DatabaseUnavailable: the database stopped answering (see
                :meth:`ensure_reachable`).
            agentlab.core.run_lock.ThreadBusy: ``thread_id`` has a run in progress (``run_lock``); nothing ran.
        """
        self.check_open()
        scenario = self.scenario(scenario)
        safeguards = preset(safeguards) if isinstance(safeguards, str) else safeguards
        thread_id = thread_id or f"{scenario.name}-{uuid.uuid4().hex[:12]}"
        t0 = time.perf_counter()
        ids = await self.create_customers(scenario, safeguards)
        prompt = scenario.prompt if model is None or isinstance(model, ScriptedChatModel) else prompt_for_model(scenario, ids)
        model = model or ScriptedChatModel(script=scenario.script(ids), seed=seed)
        graph = graph or self.graph(safeguards, model)
        ep = Episode(scenario.name, safeguards.name, thread_id, seed, ids, safeguards.schema, scenario.tenant_id)
        config = run_config(thread_id, tenant_id=scenario.tenant_id)
        inputs = {"messages": [HumanMessage(prompt)]}
        try:
            if safeguards.run_lock:  # one writer per thread for the whole run (case C18): refused when busy
                state = await invoke_with_lease(graph, self.pool, inputs, config, wait_ms=safeguards.run_lock_wait_ms,
                                                durability=durability)
            else:
                state = await graph.ainvoke(inputs, config, durability=durability)
        except ThreadBusy:
            raise
        except Exception as exc:
            if is_infrastructure(exc):
                await self.ensure_reachable(exc)
            ep.error = describe_model_error(exc, model) or f"{type(exc).__name__}: {exc}"  # a model's: no key
            snapshot = await graph.aget_state(config) if graph.checkpointer is not None else None
            state = snapshot.values if snapshot is not None else {}
        ep.error = ep.error or state.get("model_error")  # a turn that ended on an unreadable reply (C47)
        ep.messages = list(state.get("messages", []))
        ep.rollbacks_total = state.get("rollbacks_total", 0)
        ep.escalated = bool(state.get("escalated", False))
        if drain:
            ep.drain = await self.worker.drain()
        await self.events.flush()
        ep.wall_ms = (time.perf_counter() - t0) * 1000
        return ep

    async def end_state(self, ep: Episode, opening_credit_cents: list[int] | None = None) -> dict[str, Any]:
        """What the database and the provider hold for ``ep``'s customers, per customer position."""
        schema = sql.Identifier(ep.schema)
        q = sql.SQL(
            "SELECT c.id, c.credit_cents,"
            " (SELECT count(*) FROM {s}.invoices i WHERE i.customer_id = c.id),"
            " (SELECT count(*) FROM {s}.credit_memos m WHERE m.customer_id = c.id),"
            " (SELECT count(*) FROM {s}.refunds r WHERE r.customer_id = c.id)"
            " FROM {s}.customers c WHERE c.id = ANY(%s)"
        ).format(s=schema)
        async with self.pool.connection() as conn:
            rows = {r[0]: r for r in await (await conn.execute(q, (ep.customer_ids,))).fetchall()}
            pay = await (await conn.execute(
                "SELECT customer, kind, count(*) FROM provider.payments WHERE customer = ANY(%s) GROUP BY 1, 2",
                ([customer_ref(i) for i in ep.customer_ids],),
            )).fetchall()
        payments = {(c, k): n for c, k, n in pay}
        out = {"customers": []}
        for pos, cid in enumerate(ep.customer_ids):
            r = rows.get(cid)
            out["customers"].append({
                "customer_id": cid,
                "opening_credit_cents": opening_credit_cents[pos] if opening_credit_cents else None,
                "final_credit_cents": r[1] if r else None,
                "invoices": r[2] if r else 0, "credit_memos": r[3] if r else 0, "refunds": r[4] if r else 0,
                "provider_charges": payments.get((customer_ref(cid), "charge"), 0),
                "provider_refunds": payments.get((customer_ref(cid), "refund"), 0),
            })
        return out
