"""The retail (tau2) faults: what the failure lab injects into a tau2 task, each by a real mechanism (a
write watched on the wire, a crash after its COMMIT, an argument first sent wrong, a second session holding the
order's row lock, a trigger that sleeps in the first order write). The module docstring of
:mod:`agentlab.lab.tau2` tells each one; :data:`TAU2_FAULTS` lists them by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from psycopg_pool import PoolClosed

from agentlab.core.scenario import Scenario
from agentlab.lab.faults import FAULTS as CATALOG
from agentlab.lab.faults import (
    POLL_S,
    TERMINATE,
    Fault,
    SlowStatement,
    finish_background,
    one_shot_sql,
    slow_shot,
)

WRITE_PREFIXES = ("INSERT", "UPDATE", "DELETE")
EXAMPLE_PAYMENT_METHOD_NUMBER = "0000000"  # the tools' descriptions' example ids: 'gift_card_0000000', ...
LOCK_HOLD_S = 1.0  # lock_timeout: how long the other session holds the order's row lock


class WriteWatchingConnection:
    """A connection seen through: before each write statement on a ``retail.`` table, ``on_write(n, sql)``
    runs with the number of such statements the current call has sent before it."""

    def __init__(self, conn, watcher: WriteCounter):
        self._conn, self._watcher = conn, watcher

    def __getattr__(self, name):
        return getattr(self._conn, name)

    async def execute(self, query, params=None, **kwargs):
        await self._watcher.before(query)
        return await self._conn.execute(query, params, **kwargs)

    def cursor(self, *args, **kwargs):
        return WatchedCursor(self._conn.cursor(*args, **kwargs), self._watcher)

    def transaction(self, *args, **kwargs):
        return self._conn.transaction(*args, **kwargs)


class WatchedCursor:
    def __init__(self, cursor, watcher: WriteCounter):
        self._cursor, self._watcher = cursor, watcher

    def __getattr__(self, name):
        return getattr(self._cursor, name)

    async def __aenter__(self):
        await self._cursor.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._cursor.__aexit__(*exc)

    async def execute(self, query, params=None, **kwargs):
        await self._watcher.before(query)
        return await self._cursor.execute(query, params, **kwargs)

    async def executemany(self, query, params_seq, **kwargs):
        await self._watcher.before(query)
        return await self._cursor.executemany(query, params_seq, **kwargs)


class WatchingPool:
    def __init__(self, pool, watcher: WriteCounter):
        self._pool, self._watcher = pool, watcher

    def __getattr__(self, name):
        return getattr(self._pool, name)

    @contextlib.asynccontextmanager
    async def connection(self, *args, **kwargs):
        async with self._pool.connection(*args, **kwargs) as conn:
            self._watcher.run.notes["node_backend_pid"] = conn.info.backend_pid
            yield WriteWatchingConnection(conn, self._watcher)


class WriteCounter:
    """Counts a call's write statements on ``retail.`` tables; acts before the second one, once per episode."""

    def __init__(self, run, action: str):
        self.run, self.action, self.writes = run, action, 0

    async def before(self, query) -> None:
        text = query if isinstance(query, str) else ""
        if "retail." not in text or not text.lstrip().upper().startswith(WRITE_PREFIXES):
            return
        self.writes += 1
        notes = self.run.notes
        if self.writes != 2 or notes.get("crashes") or "killed_pid" in notes:
            return
        notes["mid_write"] = text.split(" SET ")[0].split(" (")[0][:60]
        if self.action == "crash":
            raise self.run.crash("inside a multi-row write, before its second statement")
        pid = notes["node_backend_pid"]
        async with self.run.pool.connection() as conn:
            done = (await (await conn.execute(TERMINATE, (pid,))).fetchone())[0]
        notes["killed_pid"], notes["terminated"] = pid, bool(done)


@dataclass(frozen=True)
class MidWrite(Fault):
    """Between the first and the second write statement of a tool call (a multi-row write), the process
    dies (``action="crash"``, resumed in a new process) or its backend is terminated (``"kill"``)."""

    action: str = "crash"

    @property
    def resumes(self) -> bool:  # type: ignore[override]
        return self.action == "crash"

    def resumes_graph(self, safeguards) -> bool:
        return self.action == "crash"

    async def arm(self, run) -> None:
        watcher = WriteCounter(run, self.action)
        run.node.pool = WatchingPool(run.node.pool, watcher)

        async def reset(call, index: int) -> None:
            watcher.writes = 0

        run.node.hooks.before_call.append(reset)


@dataclass(frozen=True)
class CrashAfterWriteCommit(Fault):
    """The process dies right after the COMMIT of the first batch holding a write tool, before LangGraph
    writes its checkpoint; the thread resumes from the last checkpoint in a new process."""

    resumes = True

    async def arm(self, run) -> None:
        writers = set(run.node.toolset.writers())

        async def die(calls) -> None:
            if not run.notes.get("crashes") and any(c.get("name") in writers for c in calls):
                raise run.crash("after a write batch's commit, before the checkpoint write")

        run.node.hooks.after_commit.append(die)


@dataclass(frozen=True)
class FirstSentWrong(Fault):
    """Every planned call of ``tools`` (every tool when empty) whose ``field`` ``corrupt`` changes is first
    sent with the changed value, which the strict argument model accepts (a string still); ``fix`` is the
    real call, what the model resends once told what was wrong."""

    tools: tuple[str, ...] = ()
    field: str = "order_id"
    corrupt: Callable[[Any], Any] = lambda value: value

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        for step, index, call in scenario.calls():
            if (self.tools and call.tool not in self.tools) or self.field not in call.args:
                continue
            bad = self.corrupt(call.args[self.field])
            if bad != call.args[self.field]:
                scenario = scenario.with_call(step, index, args={**call.args, self.field: bad}, fix=dict(call.args))
        return scenario


def without_hash(order_id: Any) -> Any:
    """``#W2378156`` -> ``W2378156`` (anything else unchanged)."""
    return order_id[1:] if isinstance(order_id, str) and order_id.startswith("#") else order_id


def capitalized(reason: Any) -> Any:
    """``no longer needed`` -> ``No longer needed``: not one of tau2's two reasons."""
    return reason[:1].upper() + reason[1:] if isinstance(reason, str) else reason


def example_payment_method(payment_method_id: Any) -> Any:
    """``gift_card_9368765`` -> ``gift_card_0000000``, the tool description's example of that kind, which
    no user has."""
    if not isinstance(payment_method_id, str) or "_" not in payment_method_id:
        return payment_method_id
    return payment_method_id.rsplit("_", 1)[0] + "_" + EXAMPLE_PAYMENT_METHOD_NUMBER


@dataclass(frozen=True)
class OrderLockHolder(Fault):
    """Another session holds ``SELECT ... FOR UPDATE`` on the first written order's row for ``hold_s``."""

    hold_s: float = LOCK_HOLD_S

    async def arm(self, run) -> None:
        writers = set(run.node.toolset.writers())
        order_id = next((c.args.get("order_id") for _s, _k, c in run.scenario.calls()
                         if c.tool in writers and "order_id" in c.args), None)
        if order_id is None:
            return
        locked = asyncio.Event()

        async def hold() -> None:
            async with run.pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT 1 FROM retail.orders WHERE order_id = %s FOR UPDATE", (order_id,))
                run.notes["locked_order"] = order_id
                locked.set()
                await asyncio.sleep(self.hold_s)

        task = asyncio.ensure_future(hold())
        run.background.append(task)
        await asyncio.wait({task, asyncio.ensure_future(locked.wait())}, return_when=asyncio.FIRST_COMPLETED)

    async def disarm(self, run) -> None:
        for task in run.background:
            with contextlib.suppress(Exception):
                await task


ORDER_SHOT_PREFIX = "chaos_slow_order_shot_"  # + the order id: the order's one-shot sequence (faults.slow_shot)
ORDER_SLOW_INSTALLED = "SELECT 1 FROM pg_trigger WHERE tgname = 'chaos_slow_order' AND tgrelid = 'retail.orders'::regclass"
ORDER_SLOW_DDL = f"""
CREATE TABLE IF NOT EXISTS public.chaos_slow_orders (order_id text PRIMARY KEY);
CREATE OR REPLACE FUNCTION public.chaos_slow_order() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public AS $$  -- fires for the agent role too
BEGIN
    IF EXISTS (SELECT 1 FROM public.chaos_slow_orders WHERE order_id = NEW.order_id) THEN
        -- one shot, as billing's: only the order's first write after arming is slow; its retry runs at once
        IF {one_shot_sql(ORDER_SHOT_PREFIX, "NEW.order_id")} THEN
            -- a marker the fault's controller can see in pg_locks: this order's write is now slow
            PERFORM pg_advisory_xact_lock_shared(4244, hashtext(NEW.order_id));
            WHILE EXISTS (SELECT 1 FROM public.chaos_slow_orders WHERE order_id = NEW.order_id) LOOP
                PERFORM pg_sleep(0.02);
            END LOOP;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_slow_order BEFORE UPDATE ON retail.orders FOR EACH ROW EXECUTE FUNCTION public.chaos_slow_order();
CREATE TRIGGER chaos_slow_order BEFORE UPDATE ON retail.order_items FOR EACH ROW EXECUTE FUNCTION public.chaos_slow_order();
CREATE TRIGGER chaos_slow_order BEFORE INSERT ON retail.payment_history FOR EACH ROW
    EXECUTE FUNCTION public.chaos_slow_order();
"""
ORDER_SLOW_SEEN = ("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 4244 "
                   "AND objid = hashtext(%s)::oid AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))")


def first_written_order(run) -> str | None:
    writers = set(run.node.toolset.writers())
    return next((c.args.get("order_id") for _s, _k, c in run.scenario.calls()
                 if c.tool in writers and "order_id" in c.args), None)


@dataclass(frozen=True)
class SlowOrderWrite(SlowStatement):
    """The catalog's ``statement_timeout`` on retail: a trigger makes the first write of the first written
    order's rows (its ``orders`` row, an item, a new payment) wait, once: the retry of that write does not
    (the one-shot sequence of :func:`~agentlab.lab.faults.slow_shot`, keyed by the order id). Once the
    statement is seen waiting, the fault lets it run ``margin_s`` past the episode's statement timeout
    (250 ms where the timeouts are on), then lifts it. A task whose order writes are all refused before any SQL writes
    (tau2 refuses them) never meets it."""

    scenarios: tuple[str, ...] = ()

    installed_sql: ClassVar[str] = ORDER_SLOW_INSTALLED
    install_ddl: ClassVar[str] = ORDER_SLOW_DDL
    install_lock: ClassVar[int] = 4245

    async def arm(self, run) -> None:
        order_id = first_written_order(run)
        if order_id is None:
            return
        slow_s = self.statement_timeout_ms / 1000 + self.margin_s
        async with run.pool.connection() as conn:
            await conn.execute(slow_shot(order_id, prefix=ORDER_SHOT_PREFIX))
            await conn.execute("INSERT INTO public.chaos_slow_orders VALUES (%s) ON CONFLICT DO NOTHING", (order_id,))
        run.notes["slow_order"] = order_id
        done = asyncio.Event()
        run.notes["_episode_done"] = done

        async def control() -> None:
            try:
                while not done.is_set():
                    async with run.pool.connection() as conn:
                        seen = (await (await conn.execute(ORDER_SLOW_SEEN, (order_id,))).fetchone())[0]
                    if seen:
                        run.notes["slow_statement_seen"] = True
                        await asyncio.sleep(slow_s)
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(done.wait(), POLL_S)
            finally:
                with contextlib.suppress(PoolClosed):
                    async with run.pool.connection() as conn:
                        await conn.execute("DELETE FROM public.chaos_slow_orders WHERE order_id = %s", (order_id,))
                        await conn.execute(slow_shot(order_id, drop=True, prefix=ORDER_SHOT_PREFIX))
                run.notes["slow_s"] = slow_s

        run.background.append(asyncio.create_task(control()))

    async def disarm(self, run) -> None:
        done = run.notes.pop("_episode_done", None)
        if done is not None:
            done.set()  # the episode is over: a write never seen will not come
        await finish_background(run.background)


TAU2_FAULTS: dict[str, Fault] = {f.name: f for f in (
    CATALOG["none"],
    MidWrite("crash_mid_node", "crash_mid_node",
             "crash inside a multi-row write (before its 2nd statement); resume in a new process", "transaction"),
    MidWrite("backend_killed", "backend_killed",
             "pg_terminate_backend inside a multi-row write (before its 2nd statement)", "transaction", action="kill"),
    CrashAfterWriteCommit("crash_before_checkpoint", "crash_before_checkpoint",
                          "crash after a write batch's commit, before the checkpoint; resume in a new process",
                          "ledger"),
    FirstSentWrong("hallucinated_order_id", "hallucinated_argument", "every order id first sent without its '#'",
                   "validation", field="order_id", corrupt=without_hash),
    FirstSentWrong("check_violation", "check_violation",
                   "every cancel reason first sent capitalized ('No longer needed'): the CHECK on the reason refuses it",
                   "constraints, transaction", tools=("cancel_pending_order",), field="reason", corrupt=capitalized),
    FirstSentWrong("fk_violation", "fk_violation",
                   "every exchange first pays with the description's example id ('gift_card_0000000'): the "
                   "FOREIGN KEY refuses it", "constraints, sanitize", tools=("exchange_delivered_order_items",),
                   field="payment_method_id", corrupt=example_payment_method),
    OrderLockHolder("lock_timeout", "lock_timeout", "a second session holds the order's row lock for 1 s",
                    "timeouts"),
    SlowOrderWrite("statement_timeout", "statement_timeout",
                   "a trigger holds the first written order's first write past the statement timeout, once",
                   "timeouts"),
)}
"""Retail's faults, by name (see the module docstring)."""

FAULTS = TAU2_FAULTS  # kept import path: the old name, which the catalog's FAULTS (agentlab.lab.faults) shares


def get_fault(name: str) -> Fault:
    """The named retail fault. Raises ValueError naming the known ones."""
    try:
        return TAU2_FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown tau2 fault {name!r}; choose one of: {', '.join(TAU2_FAULTS)}") from None
