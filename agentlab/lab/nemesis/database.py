"""Faults of the database: another session holding the customer's row lock, a trigger that sleeps inside the
customer's UPDATE, and ``pg_terminate_backend`` on the node's backend during call 2.

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import ClassVar

from psycopg import sql

from agentlab.lab.nemesis.base import (
    SERVER_GONE,
    EpisodeRunLike,
    Fault,
    ended_event,
    episode_ended,
    poll_until,
)


def _sizing_ms(run: EpisodeRunLike, attr: str) -> float:
    """The timeout a fault must outlast: the episode's own when its timeouts are on, else the full preset's
    (so the same fault reaches every preset with the same duration)."""
    from agentlab.core.safeguards import preset

    sg = run.safeguards if run.safeguards.timeouts else preset("full")
    return getattr(sg, attr)


LOCK_ROW = "SELECT 1 FROM {schema}.customers WHERE id = %s FOR UPDATE"
SOMEONE_WAITS_ON_ME = """
SELECT EXISTS (SELECT 1 FROM pg_locks w WHERE NOT w.granted AND pg_backend_pid() = ANY(pg_blocking_pids(w.pid)))
"""


@dataclass(frozen=True)
class LockHolder(Fault):
    """A second session locks the episode's first customer row (``FOR UPDATE``) and, once the episode
    waits on it, keeps it ``margin_s`` longer than the lock timeout; then commits."""

    margin_s: float = 0.2
    scenarios: tuple[str, ...] = ("refund", "invoice", "batch")  # each writes the first customer's row

    async def arm(self, run: EpisodeRunLike) -> None:
        locked, over = asyncio.Event(), ended_event(run)
        hold_s = _sizing_ms(run, "lock_timeout_ms") / 1000 + self.margin_s
        customer = run.customer_ids[0]
        query = sql.SQL(LOCK_ROW).format(schema=sql.Identifier(run.schema))

        async def hold() -> None:
            async with run.pool.connection() as conn, conn.transaction():
                await conn.execute(query, (customer,))
                run.notes["locked_customer"] = customer
                locked.set()

                async def waiter_seen() -> bool:
                    return (await (await conn.execute(SOMEONE_WAITS_ON_ME)).fetchone())[0]

                if await poll_until(over, waiter_seen):
                    run.notes["waiter_seen"] = True
                    await asyncio.sleep(hold_s)
            run.notes["lock_held_s"] = hold_s

        task = asyncio.create_task(hold())
        run.background.append(task)
        waiter = asyncio.create_task(locked.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # the holder failed before it had the lock: raise why

    async def disarm(self, run: EpisodeRunLike) -> None:
        episode_ended(run)
        await finish_background(run.background)


SLOW_SHOT_PREFIX = "chaos_slow_shot_"  # + the customer id: the billing slow statement's one-shot sequences


def one_shot_sql(prefix: str, key_sql: str) -> str:
    """A PL/pgSQL condition true for the first statement that evaluates it after :func:`slow_shot` armed
    its key, false for every later one: ``nextval`` of the sequence ``public.<prefix><key>``, where
    ``key_sql`` is the trigger's SQL expression of the key (``NEW.id``). ``nextval`` is not rolled back
    with a statement the timeout cancels, so a retry of that statement does not meet the fault again."""
    return f"nextval(format('public.%I', '{prefix}' || {key_sql})::regclass) = 1"


SLOW_INSTALLED = "SELECT 1 FROM pg_trigger WHERE tgname = 'chaos_slow_statement' AND tgrelid = 'lax.customers'::regclass"
SLOW_DDL = f"""
CREATE TABLE IF NOT EXISTS public.chaos_slow_customers (customer_id bigint PRIMARY KEY);
CREATE OR REPLACE FUNCTION public.chaos_slow_statement() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public AS $$  -- fires for the agent role too
BEGIN
    IF EXISTS (SELECT 1 FROM public.chaos_slow_customers WHERE customer_id = NEW.id) THEN
        -- one shot: only the first UPDATE after arming is slow, so the node's retry runs at once however
        -- late the controller lifts the fault (a loaded machine delays the controller, not the retry)
        IF {one_shot_sql(SLOW_SHOT_PREFIX, "NEW.id")} THEN
            -- a marker the fault's controller can see in pg_locks: this customer's statement is now slow
            PERFORM pg_advisory_xact_lock_shared(4242, NEW.id::integer);
            WHILE EXISTS (SELECT 1 FROM public.chaos_slow_customers WHERE customer_id = NEW.id) LOOP
                PERFORM pg_sleep(0.05);
            END LOOP;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER chaos_slow_statement BEFORE UPDATE ON public.customers
    FOR EACH ROW EXECUTE FUNCTION public.chaos_slow_statement();
CREATE OR REPLACE TRIGGER chaos_slow_statement BEFORE UPDATE ON lax.customers
    FOR EACH ROW EXECUTE FUNCTION public.chaos_slow_statement();
"""
SLOW_ARM = "INSERT INTO public.chaos_slow_customers (customer_id) VALUES (%s) ON CONFLICT DO NOTHING"
SLOW_DISARM = "DELETE FROM public.chaos_slow_customers WHERE customer_id = %s"


def slow_shot(key: int | str, *, drop: bool = False, prefix: str = SLOW_SHOT_PREFIX):
    """The DDL of the sequence ``public.<prefix><key>`` that makes a slow-statement trigger one shot for
    ``key`` (a customer id by default; retail's prefix takes an order id), tested by the trigger's
    :func:`one_shot_sql`: created (restarted at 1) before arming, dropped after disarming. A
    ``psycopg.sql.Composed``; ``<prefix><key>`` must fit PostgreSQL's 63-byte identifiers."""
    from psycopg import sql

    name = sql.Identifier("public", f"{prefix}{key}")
    if drop:
        return sql.SQL("DROP SEQUENCE IF EXISTS {}").format(name)
    return sql.SQL("DROP SEQUENCE IF EXISTS {0}; CREATE SEQUENCE {0}").format(name)


SLOW_SEEN = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242 AND objid = %s"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


@dataclass(frozen=True)
class SlowStatement(Fault):
    """A trigger makes the first UPDATE of the episode's first customer wait (one shot: a retry of it
    does not wait, :func:`one_shot_sql`); once that statement is seen waiting, the fault lets it run
    ``margin_s`` past the statement timeout, then lifts it.

    The episode runs with a statement timeout of ``statement_timeout_ms`` (250 ms) where its timeouts are
    on: with the ``full`` preset's 2 s every such episode would wait 2.25 s, for the same lesson (the
    timeout cuts the statement, the batch rolls back, the node retries). The slow statement lasts
    ``statement_timeout_ms + margin_s`` under every preset."""

    margin_s: float = 0.25
    statement_timeout_ms: int = 250
    scenarios: tuple[str, ...] = ("refund", "invoice", "batch")  # each updates the first customer's row

    def episode_safeguards(self, safeguards):
        if not safeguards.timeouts:
            return safeguards
        return safeguards.replace(statement_timeout_ms=self.statement_timeout_ms, name=safeguards.name)

    # the trigger: a query that finds it installed, its DDL, the advisory lock key one installer holds
    installed_sql: ClassVar[str] = SLOW_INSTALLED
    install_ddl: ClassVar[str] = SLOW_DDL
    install_lock: ClassVar[int] = 4243

    async def install(self, pool) -> None:
        """Install the trigger once per database (idempotent; concurrent installers wait for each other)."""
        async with pool.connection() as conn:
            if await (await conn.execute(self.installed_sql)).fetchone() is None:
                await conn.execute("SELECT pg_advisory_lock(%s)", (self.install_lock,))  # one installer at a time
                try:
                    if await (await conn.execute(self.installed_sql)).fetchone() is None:
                        await conn.execute(self.install_ddl)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (self.install_lock,))

    async def arm(self, run: EpisodeRunLike) -> None:
        await self.install(run.pool)
        customer = run.customer_ids[0]
        slow_s = self.statement_timeout_ms / 1000 + self.margin_s
        async with run.pool.connection() as conn:
            await conn.execute(slow_shot(customer))
            await conn.execute(SLOW_ARM, (customer,))
        run.notes["slow_customer"] = customer

        over = ended_event(run)

        async def seen() -> bool:
            async with run.pool.connection() as conn:
                return (await (await conn.execute(SLOW_SEEN, (customer,))).fetchone())[0]

        async def control() -> None:
            try:
                if await poll_until(over, seen):
                    run.notes["slow_statement_seen"] = True
                    await asyncio.sleep(slow_s)
            except SERVER_GONE:  # the server stopped: the episode meets that itself; nothing left to control
                run.notes["controller_lost_server"] = True
            finally:
                with contextlib.suppress(*SERVER_GONE):  # shutting down (Ctrl-C) or no server: nothing to disarm on
                    async with run.pool.connection() as conn:
                        await conn.execute(SLOW_DISARM, (customer,))
                        await conn.execute(slow_shot(customer, drop=True))
                run.notes["slow_s"] = slow_s

        run.background.append(asyncio.create_task(control()))

    async def disarm(self, run: EpisodeRunLike) -> None:
        episode_ended(run)
        await finish_background(run.background)


FINISH_CAP_S = 10.0  # how long a disarm waits for a controller told the episode ended (it stops within POLL_S)


async def finish_background(tasks: list) -> None:
    """Wait for a fault's background tasks (cancel one that outlives its cap); raise what one raised.
    Cancelled itself (the episode is), it cancels them too: none outlives its episode."""
    try:
        for task in tasks:
            if not task.done():
                done, _ = await asyncio.wait([task], timeout=FINISH_CAP_S)
                if not done:
                    task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise


# --------------------------------------------------------------------------- killed backend, crashes

class _PidRecordingPool:
    """The node's pool, recording the backend pid of each connection it hands out (for the killer)."""

    def __init__(self, pool, run: EpisodeRunLike):
        self._pool = pool
        self._run = run

    def __getattr__(self, name):
        return getattr(self._pool, name)

    @contextlib.asynccontextmanager
    async def connection(self, *args, **kwargs):
        async with self._pool.connection(*args, **kwargs) as conn:
            self._run.notes["node_backend_pid"] = conn.info.backend_pid
            yield conn


TERMINATE = "SELECT pg_terminate_backend(%s, 5000)"  # waits up to 5 s for the backend to exit (PostgreSQL 14+)


@dataclass(frozen=True)
class KillBackend(Fault):
    """Before call ``at_call`` of the first batch that reaches it, another session terminates the node's
    backend (``pg_terminate_backend``): the next statement meets a dead connection."""

    at_call: int = 1

    async def arm(self, run: EpisodeRunLike) -> None:
        run.node.pool = _PidRecordingPool(run.node.pool, run)

        async def kill(call, index: int) -> None:
            if index != self.at_call or "killed_pid" in run.notes:
                return
            pid = run.notes["node_backend_pid"]
            async with run.pool.connection() as conn:
                done = (await (await conn.execute(TERMINATE, (pid,))).fetchone())[0]
            run.notes["killed_pid"] = pid
            run.notes["terminated"] = bool(done)

        run.node.hooks.before_call.append(kill)
