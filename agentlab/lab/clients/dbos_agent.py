"""A DBOS agent under test: the lab's first durable-engine client, each life of it a process of its own.

DBOS Transact is one instance per process and recovers PENDING workflows at ``DBOS.launch()``, so the lab
owns the process boundary: :meth:`DbosAgent.start` runs the agent (:mod:`agentlab.lab.clients.dbos_app`)
in a child process; after that process died, :meth:`DbosAgent.recover` starts a new one whose launch
recovers the workflow. DBOS's own tables live in a system database per episode on the episode's server,
created and dropped by the lab (:class:`SystemDatabase`). What DBOS recorded maps back to the kit's
messages (the AIMessages with their tool calls, one ToolMessage per call, tool names as the domain's), so
the generic checker (:func:`agentlab.lab.invariants.check_episode`) runs unchanged, and DBOS's own verdict
(``SUCCESS``, ``ERROR``, or ``PENDING`` when the time cap ended the life) is reported beside it.

:func:`run_dbos_episode` plays billing's refund story once:

=======================  =================================================================================
fault                    mechanism
=======================  =================================================================================
``none``                 the refund story without its hallucination
``refund_story``         as scripted: the refund's customer id arrives as ``"12'"``; the tool's error text
                         (SQLAlchemy's, statement included) goes to the model, which resends the batch
``crash_inside_step``    the deduction (billing's ``UPDATE customers SET credit_cents``) commits, then the
                         child dies (``os._exit(99)``) before DBOS records the step; armed by a death flag
                         (:mod:`agentlab.lab.nemesis.death`) so it fires once across processes; a new child
                         recovers
``stuck_retry``          the refund's amount is over the provider's maximum; the provider refuses it (HTTP 400);
                         a step is not retried by default, so the error goes to the model, which resends the
                         right amount under the same reference (the first refund row is already committed)
=======================  =================================================================================

DBOS is an optional install (``pip install -r requirements-engines.txt``); :func:`engine_missing` says so in
one line where it is not installed. Sources: docs.dbos.dev "Transactions & Datasources", "Workflow
Recovery", "DBOS Client"; ``dbos/_datasource.py`` and ``dbos/_core.py`` (3.4.0) for where each result is
recorded.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from agentlab.lab.agents import as_domain_messages
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES
from agentlab.lab.clients.dbos_app import MESSAGES_EVENT
from agentlab.lab.clients.engine import INSTALL_HINT, EngineLife, package_versions, run_life
from agentlab.runtime.conninfo import with_dbname
from agentlab.runtime.databases import keep_private

SHAPES = ("transactions", "steps")
CAP_S = 60.0  # how long one life may run before the lab ends it (the workflow then stays PENDING)
CRASH_STATEMENT = "UPDATE customers SET credit_cents"  # billing's deduction (ApplyCredit's statement)
SYSTEM_DB_PREFIX = "agentlab_dbos_"
APP_MODULE = "agentlab.lab.clients.dbos_app"  # the module each life runs (``python -m APP start|recover SPEC``)



def engine_missing() -> str | None:
    """One line saying how to install DBOS when it is not importable here; None when it is."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        return f"the DBOS agent needs DBOS Transact, an optional install: {INSTALL_HINT}"
    return None


def versions(*extra: str) -> dict[str, str]:
    """The measured packages' versions (``{"dbos": "3.4.0", "sqlalchemy": ..., ...}``, then ``extra``'s
    distributions; ``"-"`` where absent)."""
    return package_versions("dbos", "sqlalchemy", "psycopg", "langchain-core", "langgraph", *extra)


def sqlalchemy_url(conninfo: str) -> str:
    """``conninfo`` (a libpq URL or key=value string) as a SQLAlchemy URL for psycopg 3
    (``postgresql+psycopg://user:password@host:port/dbname``; a socket directory goes in ``?host=``)."""
    p = conninfo_to_dict(conninfo)
    auth = quote(p.get("user") or "", safe="")
    if p.get("password"):
        auth += ":" + quote(p["password"], safe="")
    host, port, query = p.get("host") or "", p.get("port") or "", ""
    if host.startswith("/"):
        query, host = f"?host={quote(host, safe='')}" + (f"&port={port}" if port else ""), ""
    elif port:
        host += f":{port}"
    return f"postgresql+psycopg://{auth}{'@' if auth else ''}{host}/{quote(p.get('dbname') or 'postgres', safe='')}{query}"


class SystemDatabase:
    """DBOS's system database for one episode: ``agentlab_dbos_<8 hex>`` on the server of ``url``, created
    by :meth:`create` (private to its owner, as every database of the kit: case C52) and dropped, its
    sessions closed, by :meth:`drop`. Both raise ``psycopg.Error`` when the server refuses (no CREATEDB)."""

    def __init__(self, url: str):
        self.url = url
        self.name = f"{SYSTEM_DB_PREFIX}{secrets.token_hex(4)}"
        self.conninfo = with_dbname(url, self.name)

    async def create(self) -> SystemDatabase:
        def create() -> None:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
                keep_private(conn, self.name)

        await asyncio.to_thread(create)
        return self

    async def drop(self) -> None:
        def drop() -> None:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))

        await asyncio.to_thread(drop)


DbosLife = EngineLife  # one child process (kept name)


class DbosAgent:
    """The handle on one DBOS agent run: the workflow ``workflow_id`` on ``system`` (a created
    :class:`SystemDatabase`), its tools writing to the episode's database ``url``; each life runs the module
    ``app`` (:data:`APP_MODULE`, or another DBOS application with the same ``start|recover SPEC`` command line
    and :data:`MESSAGES_EVENT`, such as :mod:`agentlab.lab.clients.pydantic_ai_app`); ``route(conninfo) -> conninfo``
    is how a life reaches the application's and DBOS's databases (default as given; the yardstick routes them
    through its round-trip counter; the provider and the death flags keep ``url``).

    :meth:`start` and :meth:`recover` each run one life in a child process and return its
    :class:`agentlab.lab.clients.engine.EngineLife`;
    :meth:`verdict` and :meth:`messages` read DBOS's record through ``DBOSClient``."""

    def __init__(self, url: str, system: SystemDatabase, workflow_id: str, shape: str, workdir: str, *,
                 cap_s: float = CAP_S, app: str = APP_MODULE, route=None):
        if shape not in SHAPES:
            raise ValueError(f"unknown DBOS agent shape {shape!r}; choose one of: {', '.join(SHAPES)}")
        self.url, self.system, self.workflow_id, self.shape = url, system, workflow_id, shape
        self.workdir, self.cap_s, self.app = Path(workdir), cap_s, app
        self.route = route or (lambda conninfo: conninfo)
        self.lives: list[DbosLife] = []

    def _spec(self, **extra) -> Path:
        route = self.route
        spec = {"app_url": sqlalchemy_url(route(self.url)), "system_url": sqlalchemy_url(route(self.system.conninfo)),
                "provider_conninfo": self.url, "workflow_id": self.workflow_id, "shape": self.shape, **extra}
        path = self.workdir / f"life{len(self.lives)}.json"
        path.write_text(json.dumps(spec))
        return path

    async def start(self, prompt: str, script: list, seed: int = 0, *, crash_after: str | None = None) -> DbosLife:
        """First life: launch DBOS and run the workflow ``refund_agent(prompt, script, seed, shape)``
        (``script``: batches of :class:`agentlab.core.scenario.PlannedCall`, the agent's tool names) to its
        end, its death or the cap. ``crash_after``: the statement prefix the crash fault watches."""
        calls = [[{"tool": c.tool, "args": c.args, "fix": c.fix, "reorder": c.reorder} for c in step] for step in script]
        return await self._life("start", self._spec(prompt=prompt, script=calls, seed=seed,
                                                    crash_after_statement=crash_after))

    async def recover(self, *, crash_after: str | None = None) -> DbosLife:
        """A new life after a death: its ``DBOS.launch()`` recovers the PENDING workflow; it waits for it."""
        return await self._life("recover", self._spec(crash_after_statement=crash_after))

    async def _life(self, mode: str, spec: Path) -> EngineLife:
        life = await run_life(self.app, mode, spec, self.workdir / f"life{len(self.lives)}.log", self.cap_s)
        self.lives.append(life)
        return life

    def _client(self):
        from dbos import DBOSClient

        return DBOSClient(system_database_url=sqlalchemy_url(self.system.conninfo))

    async def verdict(self) -> dict:
        """DBOS's record of the workflow: ``{"status": "SUCCESS" | "ERROR" | "PENDING" | ...,
        "recovery_attempts": int, "steps": int}`` (``status`` ``"NOT STARTED"`` when DBOS has no row, or no
        tables: a first life that failed before its launch, whose output is in :attr:`lives`)."""
        def read() -> dict:
            from sqlalchemy.exc import ProgrammingError

            client = self._client()
            try:
                try:
                    rows = client.list_workflows(workflow_ids=[self.workflow_id])
                except ProgrammingError:  # no dbos.workflow_status: DBOS never launched on this database
                    rows = []
                if not rows:
                    return {"status": "NOT STARTED", "recovery_attempts": 0, "steps": 0}
                steps = client.list_workflow_steps(self.workflow_id, load_output=False)
                return {"status": rows[0].status, "recovery_attempts": rows[0].recovery_attempts or 0,
                        "steps": len(steps)}
            finally:
                client.destroy()

        return await asyncio.to_thread(read)

    async def messages(self) -> list:
        """The run's messages as DBOS recorded them (the workflow's :data:`MESSAGES_EVENT`), tool names
        mapped back to the domain's; ``[]`` when no batch was recorded."""
        from langchain_core.messages import messages_from_dict

        def read():
            client = self._client()
            try:
                return client.get_event(self.workflow_id, MESSAGES_EVENT, timeout_seconds=0)
            finally:
                client.destroy()

        recorded = await asyncio.to_thread(read)
        return as_domain_messages(messages_from_dict(recorded or []), BASELINE_TOOL_NAMES)
