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
                         child dies (``os._exit(99)``) before DBOS records the step; armed by a row of
                         ``lab_crash_flags`` so it fires once across processes; a new child recovers
=======================  =================================================================================

DBOS is an optional install (``pip install -r requirements-engines.txt``); :func:`engine_missing` says so in
one line where it is not installed. Sources: docs.dbos.dev "Transactions & Datasources", "Workflow
Recovery", "DBOS Client"; ``dbos/_datasource.py`` and ``dbos/_core.py`` (3.4.0) for where each result is
recorded.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from agentlab.core.safeguards import preset
from agentlab.lab.agents import as_domain_messages, rename_script
from agentlab.lab.agents.billing_tools import BASELINE_TOOL_NAMES
from agentlab.lab.clients.dbos_app import (
    CRASH_EXIT_CODE,
    CRASH_FLAGS_TABLE,
    MESSAGES_EVENT,
    crash_flag,
)
from agentlab.lab.invariants import KINDS, check_episode
from agentlab.runtime.conninfo import with_dbname
from agentlab.runtime.databases import keep_private
from agentlab.runtime.harness import Episode

SHAPES = ("transactions", "steps")
FAULTS = ("none", "refund_story", "crash_inside_step")
INSTALL_HINT = "pip install -r requirements-engines.txt"
CAP_S = 60.0  # how long one life may run before the lab ends it (the workflow then stays PENDING)
CRASH_STATEMENT = "UPDATE customers SET credit_cents"  # billing's deduction (ApplyCredit's statement)
SYSTEM_DB_PREFIX = "agentlab_dbos_"
ROOT = Path(__file__).resolve().parents[3]  # the directory holding the agentlab package

CREATE_FLAGS = f"CREATE TABLE IF NOT EXISTS {CRASH_FLAGS_TABLE} (flag text PRIMARY KEY)"
ARM_FLAG = f"INSERT INTO {CRASH_FLAGS_TABLE} (flag) VALUES (%s) ON CONFLICT DO NOTHING"
DISARM_FLAG = f"DELETE FROM {CRASH_FLAGS_TABLE} WHERE flag = %s RETURNING flag"


def engine_missing() -> str | None:
    """One line saying how to install DBOS when it is not importable here; None when it is."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        return f"the DBOS agent needs DBOS Transact, an optional install: {INSTALL_HINT}"
    return None


def versions() -> dict[str, str]:
    """The measured packages' versions (``{"dbos": "3.4.0", "sqlalchemy": ..., ...}``; ``"-"`` where absent)."""
    out = {}
    for name in ("dbos", "sqlalchemy", "psycopg", "langchain-core", "langgraph"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    return out


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


@dataclass
class DbosLife:
    """One child process: ``mode`` (``"start"`` or ``"recover"``), its exit code (``99``: the crash fault;
    ``None``: ended by the lab at the time cap), its wall time in seconds, and the tail of its output."""

    mode: str
    returncode: int | None
    wall_s: float
    output_tail: str = ""

    @property
    def crashed(self) -> bool:
        return self.returncode == CRASH_EXIT_CODE


class DbosAgent:
    """The handle on one DBOS agent run: the workflow ``workflow_id`` on ``system`` (a created
    :class:`SystemDatabase`), its tools writing to the episode's database ``url``.

    :meth:`start` and :meth:`recover` each run one life in a child process and return its :class:`DbosLife`;
    :meth:`verdict` and :meth:`messages` read DBOS's record through ``DBOSClient``."""

    def __init__(self, url: str, system: SystemDatabase, workflow_id: str, shape: str, workdir: str, *,
                 cap_s: float = CAP_S):
        if shape not in SHAPES:
            raise ValueError(f"unknown DBOS agent shape {shape!r}; choose one of: {', '.join(SHAPES)}")
        self.url, self.system, self.workflow_id, self.shape = url, system, workflow_id, shape
        self.workdir, self.cap_s = Path(workdir), cap_s
        self.lives: list[DbosLife] = []

    def _spec(self, **extra) -> Path:
        spec = {"app_url": sqlalchemy_url(self.url), "system_url": sqlalchemy_url(self.system.conninfo),
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

    async def _life(self, mode: str, spec: Path) -> DbosLife:
        log = self.workdir / f"life{len(self.lives)}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        t0 = time.perf_counter()
        with open(log, "wb") as out:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentlab.lab.clients.dbos_app", mode,
                                                        str(spec), stdout=out, stderr=out, env=env)
            try:
                code: int | None = await asyncio.wait_for(proc.wait(), self.cap_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                code = None
        tail = log.read_text(errors="replace")[-2000:]
        life = DbosLife(mode, code, time.perf_counter() - t0, tail)
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


@dataclass
class DbosEpisode:
    """One episode of the DBOS agent: what the checker found (``violations``, by kind in :meth:`counts`),
    what DBOS says (``verdict``: its status, ``recovery_attempts``, ``steps`` recorded), and how it ran
    (``lives``: one :class:`DbosLife` per process; ``wall_s`` in seconds for the whole episode, databases
    included; ``versions`` of the packages measured)."""

    shape: str
    fault: str
    seed: int
    scenario: str
    workflow_id: str
    customer_ids: list[int] = field(default_factory=list)
    system_database: str = ""
    verdict: dict = field(default_factory=dict)
    lives: list[DbosLife] = field(default_factory=list)
    violations: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def crashed(self) -> bool:
        return any(life.crashed for life in self.lives)

    @property
    def status(self) -> str:
        """DBOS's status of the workflow (``"SUCCESS"``, ``"ERROR"``, ``"PENDING"``...)."""
        return self.verdict.get("status", "")

    def counts(self) -> dict[str, int]:
        """Violations by kind: every kind of :data:`agentlab.lab.invariants.KINDS`, then any other."""
        c = Counter(v.kind for v in self.violations)
        return {**{k: c.get(k, 0) for k in KINDS}, **{k: n for k, n in c.items() if k not in KINDS}}


async def run_dbos_episode(harness, fault: str = "none", *, seed: int = 0, shape: str = "transactions",
                           cap_s: float = CAP_S) -> DbosEpisode:
    """Play billing's refund story with the DBOS agent of ``shape`` under ``fault``, then check it.

    Args:
        harness: an open :class:`agentlab.runtime.harness.Harness` on billing (its database, provider, domain).
        fault: one of :data:`FAULTS`.
        seed: seeds the scripted model's tool call ids.
        shape: ``"transactions"`` (datasource transactions, the provider call a step) or ``"steps"``.
        cap_s: seconds each life may run before the lab kills it (DBOS then reports ``PENDING``).

    Returns:
        the :class:`DbosEpisode`, the DBOS system database already dropped.

    Raises:
        ValueError: an unknown fault or shape.
        agentlab.core.errors.AgentlabError: DBOS is not installed (the message says how to install it).
    """
    from agentlab.core.errors import AgentlabError

    if fault not in FAULTS:
        raise ValueError(f"the DBOS agent has no fault {fault!r}; choose one of: {', '.join(FAULTS)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown DBOS agent shape {shape!r}; choose one of: {', '.join(SHAPES)}")
    if (missing := engine_missing()) is not None:
        raise AgentlabError(missing)
    h = harness
    h.check_open()
    t0 = time.perf_counter()
    sc = h.scenario("refund")
    sc = sc if fault == "refund_story" else sc.clean()
    sg = preset("constraints")  # a foreign agent is checked as the constraints preset: no ledger, no outbox
    workflow_id = f"dbos-{shape}-{fault}-{secrets.token_hex(6)}"
    async with h.pool.connection() as conn:
        ids = await h.domain.create_rows(conn, sc, sg.schema)
        await conn.execute(CREATE_FLAGS)
    out = DbosEpisode(shape, fault, seed, sc.name, workflow_id, ids, versions=versions())
    crash_after = CRASH_STATEMENT if fault == "crash_inside_step" else None
    system = await SystemDatabase(h.url).create()
    out.system_database = system.name
    try:
        with tempfile.TemporaryDirectory(prefix="agentlab-dbos-") as workdir:
            agent = DbosAgent(h.url, system, workflow_id, shape, workdir, cap_s=cap_s)
            if crash_after:
                async with h.pool.connection() as conn:
                    await conn.execute(ARM_FLAG, (crash_flag(workflow_id),))
            try:
                life = await agent.start(sc.prompt, rename_script(sc.script(ids), BASELINE_TOOL_NAMES), seed,
                                         crash_after=crash_after)
                if life.crashed:
                    await agent.recover(crash_after=crash_after)
            finally:
                async with h.pool.connection() as conn:
                    await conn.execute(DISARM_FLAG, (crash_flag(workflow_id),))
            out.lives = agent.lives
            out.verdict = await agent.verdict()
            out.messages = await agent.messages()
    finally:
        await system.drop()
    ep = Episode(sc.name, f"dbos:{shape}", workflow_id, seed, ids, sg.schema, sc.tenant_id, messages=out.messages)
    out.violations = await check_episode(h.pool, ep, sc, sg, h.domain)
    out.wall_s = time.perf_counter() - t0
    return out
