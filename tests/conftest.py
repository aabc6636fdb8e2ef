"""Shared fixtures: every test gets its own fresh database on the server in use.

The server is ``DATABASE_URL`` when set, else the embedded one (see ``agentlab.runtime.db``). Databases are
created from the migrated template and dropped after the test. A drop waits for a checkpoint (PostgreSQL
forces one per DROP DATABASE: a second or more on a busy machine) and a copy of the template (about 9 MB)
takes a fraction of one, so each worker process makes the next test's database on a background thread
while the current test runs, and drops finished ones on others: a test still gets a database no one
has used, made from the template, and never waits for a drop. Every database made this way is dropped
before the session ends.

Under pytest-xdist (``-n auto --dist loadfile``, the project's options) the work is split finer than files
(:class:`SplitScheduling`): each test is a unit of its own, except a notebook's cells and the tests of a file
with a module-scoped fixture, which stay together on one worker; the longest units go out first.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest
from psycopg import sql

from agentlab.runtime import db
from agentlab.runtime.harness import Harness

DROP_THREADS = 8  # drops that wait for checkpoints at the same time share them

# Test files whose tests share a module-scoped fixture: each stays whole on one worker (tests/test_conftest.py
# checks that this names every such file).
WHOLE_FILES = frozenset({"tests/test_browser.py", "tests/test_c46_server_restart_mid_run.py",
                         "tests/test_chaos_interrupts.py", "tests/test_experiments.py", "tests/test_retail_port.py", "tests/test_site.py"})
# Units that take longest (seconds measured with --durations on 2 cores), sent out first so that none of them
# starts last and runs alone at the end. The order only moves the wall time, never a result; a unit missing
# here runs in collection order after these.
LONGEST_FIRST = (
    "tests/test_browser.py",  # about 6 minutes, whole (one JupyterLab for every notebook)
    "tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[20_",  # 225 s (its DBOS agents start processes)
    "tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[19_",  # 82 s
    "tests/test_bench.py::test_bench_quick_json",  # 73 s
    "tests/test_c53_eight_attendees_at_once.py",  # 43 s alone (eight kernels at once)
    "tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[18_",  # 34 s
    "tests/test_yardstick.py::test_chaos_agent_prints_the_table",  # 31 s
    "tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[10_",  # 30 s
    "tests/test_chaos_interrupts.py",  # 29 s, whole
    "tests/test_experiments.py",  # 27 s, whole
    "tests/test_retail_port.py",  # 25 s, whole
    "tests/test_rerun_safety.py::test_each_code_cell_run_twice_prints_what_it_stored[17_",  # 25 s
    "tests/test_rerun_safety.py::",  # 8 to 18 s each
    "tests/test_yardstick.py::",
    "tests/test_hostile.py::test_hostile_batches_through_the_full_node",  # 16 s
    "tests/test_c14_notebooks_under_nbval.py::test_c14_a_notebook",  # 15 s
    "tests/test_solutions.py::",
)


# The whole-suite units left out of the fast tier (`pytest -m "not slow"`): each is a minute or more of CPU, and
# what it runs is reached by a faster test too (every module is imported and exercised without them).
SLOW = (
    "tests/test_browser.py", "tests/test_rerun_safety.py::", "tests/test_c14_notebooks_under_nbval.py::test_c14_a_notebook",
    "tests/test_bench.py::test_bench_quick_json", "tests/test_yardstick.py::test_chaos_agent_prints_the_table",
    "tests/test_chaos_interrupts.py", "tests/test_retail_port.py", "tests/test_hostile.py::test_hostile_batches",
    "tests/test_c46_server_restart_mid_run.py", "tests/test_experiments.py",
)


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: the notebook or the file for those kept whole, else the test."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") or path in WHOLE_FILES else nodeid


def _rank(nodeid: str) -> int:
    """Where ``nodeid``'s unit goes in the queue: its place in :data:`LONGEST_FIRST`, else after them."""
    return next((n for n, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    """Put the longest units first (:data:`LONGEST_FIRST`); a unit's tests keep their order (a notebook's
    cells run in order). Every worker collects and sorts the same way, so their collections agree. A test
    named after a case (``test_c25_...``, or in a file ``test_c25_...``) gets the marker ``case("C25")``
    unless it carries one (``pytest -m case`` runs them all; ``tests/case_index.py`` lists them by case)."""
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("case") is None and (found := case_of(item.name, item.path.name)):
            item.add_marker(pytest.mark.case(found))
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: the order within a rank is kept


def case_of(*names: str) -> str | None:
    """The case id (``"C25"``) a test or file name carries (``test_c25_...``), None when none does."""
    for name in names:
        m = re.match(r"test_c(\d\d)_", name)
        if m:
            return f"C{m.group(1)}"
    return None


CONNECTIONS_PER_WORKER = 45  # what one xdist worker may hold on the server at its peak (an experiment, a re-run)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per core and one more. A few tests mostly wait (the yardstick's wire latency,
    fault timeouts, a kernel starting): a third worker on 2 cores keeps the CPU busy through those waits
    (5 min 36 s against 6 min 19 s for the suite without the browser test, measured idle).

    On a server of ``DATABASE_URL``, also no more workers than its ``max_connections`` holds at
    :data:`CONNECTIONS_PER_WORKER` each: a worker running an experiment or a notebook's re-run holds up to ~40,
    and three of them at once met "too many clients already" on a default server of 100 (the kit's embedded
    server allows 300)."""
    workers = (os.cpu_count() or 1) + 1
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        try:
            with psycopg.connect(url, connect_timeout=3) as conn:
                max_connections = int(conn.execute("SHOW max_connections").fetchone()[0])
            workers = max(1, min(workers, max_connections // CONNECTIONS_PER_WORKER))
        except (psycopg.Error, ValueError):
            pass  # no server: the tests say so themselves
    return workers


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``, :class:`SplitScheduling`; any other ``--dist`` keeps xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SplitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with a unit per test (:func:`_unit`), in collection order: a worker that
        runs low gets the next unit, so no file of slow tests keeps one worker busy while the other idles."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # keep the collection's order: longest first

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return SplitScheduling(config, log)


class FreshDatabases:
    """Fresh databases for one worker process: the next one is made on a background thread while a test
    runs, and finished ones are dropped on others (a drop waits for a checkpoint, so a create must not
    queue behind it; drops waiting together are served by one checkpoint). The threads read no environment and no module state: the server's URL and the
    template's name are taken once, at the start of the session."""

    def __init__(self, admin_url: str, template: str):
        self.admin_url = admin_url
        self.template = template
        self.maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-database-create")
        self.dropper = ThreadPoolExecutor(max_workers=DROP_THREADS, thread_name_prefix="test-database-drop")
        self.errors: list[BaseException] = []
        self.next: Future = self.maker.submit(self._create)

    def _create(self) -> str:
        """Copy the template into a new ``agentlab_test_<random>`` (as :func:`db.create_database` does)."""
        name = f"{db.DB_PREFIX}test_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_S) as conn:
            for attempt in range(20):
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(self.template)))
                    break
                except psycopg.errors.ObjectInUse:  # a session is attached to the template; retry
                    time.sleep(0.05 * (attempt + 1))
            else:
                raise RuntimeError(f"template {self.template} stayed busy")
        return db.with_dbname(self.admin_url, name)

    def _drop(self, url: str) -> None:
        try:
            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=db.CONNECT_TIMEOUT_S) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(db.dbname_of(url))))
        except psycopg.Error as exc:  # reported when the session ends
            self.errors.append(exc)

    def take(self) -> str:
        """A database no test has used. Made ahead when that worked and it still exists (a rebuilt
        template or another process's ``db clean`` may have removed it); else made now, by
        :func:`db.create_database`, which also rebuilds a missing template."""
        made, self.next = self.next, self.maker.submit(self._create)
        try:
            url = made.result()
        except (psycopg.Error, RuntimeError):  # made now, below: its error, if any, is the one to see
            url = None
        if url is not None:
            with db.admin_connection() as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db.dbname_of(url),)).fetchone():
                    return url
        return db.create_database("test")

    def give_back(self, url: str) -> None:
        self.dropper.submit(self._drop, url)

    def close(self) -> None:
        """Drop the database made ahead and wait for every drop; raise the first drop that failed."""
        try:
            self._drop(self.next.result())
        except (psycopg.Error, RuntimeError) as exc:
            self.errors.append(exc)
        self.maker.shutdown(wait=True)
        self.dropper.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


@pytest.fixture(scope="session", autouse=True)
def _server():
    """Start (or reach) the server and build the template once per session; fail with one clear line."""
    try:
        template = db.ensure_template()
        databases = FreshDatabases(db.server_url(), template)
    except db.DatabaseUnavailable as exc:
        pytest.exit(f"agentlab tests need a database: {exc}", returncode=2)
    yield databases
    databases.close()


@pytest.fixture
def database_url(_server):
    """Conninfo of a fresh database (made from the template, used by no other test), dropped after the test."""
    url = _server.take()
    yield url
    _server.give_back(url)


@pytest.fixture
async def harness(database_url):
    """A :class:`Harness` on the test's fresh database."""
    h = await Harness.open(database_url)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture(autouse=True)
def _quiet_events(caplog):
    caplog.set_level(logging.INFO, logger="agentlab.core.events")
    yield


async def fetch(h: Harness, query: str, params=()) -> list[tuple]:
    """All rows of ``query`` on the harness's database (a helper for assertions)."""
    async with h.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def scalar(h: Harness, query: str, params=()):
    rows = await fetch(h, query, params)
    return rows[0][0] if rows else None


async def customer_state(h: Harness, customer_id: int) -> dict:
    """What the database and the provider hold for one billing customer: credit left (cents), credit memos,
    refunds, refunds the provider paid."""
    return {
        "credit": await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (customer_id,)),
        "memos": await scalar(h, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (customer_id,)),
        "refunds": await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (customer_id,)),
        "paid_refunds": await scalar(
            h, "SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'refund'", (f"cus_{customer_id}",)),
    }


def kinds(run) -> dict[str, int]:
    """``{kind: count}`` of a run's violations (any object with ``violations``), kinds that occurred only."""
    out: dict[str, int] = {}
    for v in run.violations:
        out[v.kind] = out.get(v.kind, 0) + 1
    return out


def engine_installed(*modules: str) -> bool:
    """True when every one of ``modules`` (``"dbos"``, ``"temporalio"``...) is installed: the engines are an
    optional install (``requirements-engines.txt``)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


async def engine_episode(harness, agent: str, fault: str):
    """One refund-story episode of the engine's ``agent`` under ``fault`` through the yardstick: ``(run, its
    engine notes, the customer's state)`` (:func:`customer_state`). Asserts the episode ran (not n/a)."""
    from agentlab.lab.yardstick import Yardstick

    run = await Yardstick(harness).run(agent, fault, scenario="refund")
    assert run.status == "ran", run.reason
    return run, run.notes["engine"], await customer_state(harness, run.customer_ids[0])


class TurnModel:
    """Builds a LangChain chat model that answers by the number of AIMessages already in the history:
    reply ``n`` is ``turns[n](messages)`` (an AIMessage, or a callable of the history giving one), and a
    plain "done." once the turns run out. Deterministic from the history alone, so a resumed thread
    continues where it stopped. For tool call shapes the scripted model never sends (no id, invalid
    JSON, one id on every turn)."""

    def __new__(cls, turns):
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration, ChatResult

        class _TurnModel(BaseChatModel):
            turns: list
            calls: int = 0

            @property
            def _llm_type(self) -> str:
                return "agentlab-test-turns"

            def bind_tools(self, tools, **kwargs):
                return self

            def _generate(self, messages, stop=None, run_manager=None, **kwargs):
                self.calls += 1
                n = sum(isinstance(m, AIMessage) for m in messages)
                reply = self.turns[n] if n < len(self.turns) else AIMessage("done.")
                reply = reply(messages) if callable(reply) else reply.model_copy(deep=True)
                reply.id = None  # a fresh run id per call, as a provider's response has
                return ChatResult(generations=[ChatGeneration(message=reply)])

        return _TurnModel(turns=list(turns))
