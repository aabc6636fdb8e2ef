"""The fault catalog: what goes wrong around an agent, each injected by a real mechanism.

Twelve kinds of fault (:data:`FAMILIES`); the first, a hallucinated argument, comes in four
variants with their own names because different safeguards hold them. Every fault is scoped to its
own episode (its customers, its thread, its node and worker), so many episodes can run at once on
one database, one provider and one process.

===========================  ===============================================================================
fault                        mechanism
===========================  ===============================================================================
``wrong_type``               the model sends an amount in major units as a decimal (``25.0`` for 2500 cents)
``negative_amount``          the model sends a negative amount to a deduction
``stray_quote``              the model sends a customer id as text with a stray quote (``"12'"``)
``other_tenant_id``          the model names a customer of another tenant (one the episode created)
``check_violation``          the model deducts more credit than the customer has (CHECK)
``unique_violation``         the model creates a record again under the same natural key (UNIQUE)
``fk_violation``             the model names an invoice that does not exist (FOREIGN KEY)
``lock_timeout``             a second session holds ``SELECT ... FOR UPDATE`` on the customer's row
``statement_timeout``        a trigger sleeps inside the customer's UPDATE, past the statement timeout
``backend_killed``           another session runs ``pg_terminate_backend`` on the node's backend during call 2
``crash_before_checkpoint``  the process dies after the business COMMIT, before the checkpoint write;
                             the thread resumes from its checkpoint in a new process
``crash_mid_node``           the process dies before call 2 of a batch; the thread resumes in a new process
``provider_timeout``         the provider performs the payment, then the caller's request times out
``worker_crash``             the process calling the provider dies after the call and before recording it:
                             the outbox worker (outbox on) or the tools node calling inline (outbox off);
                             a new process resumes
``provider_forgot_key``      as ``worker_crash``, and the resume comes days later: the provider's clock has
                             moved past its idempotency-key retention
``wrong_order``              dependent calls in the wrong order in one step (the ``reorder`` scenario)
``none``                     no fault: the control row, every preset should hold
===========================  ===============================================================================

Hallucinations go into the script (:meth:`agentlab.domains.billing.scenarios.Scenario.with_call`), so the model
really emits them; ``fix`` is what a careful LLM sends once told which argument is wrong.
A fault never sets a flag the code under test reads: it holds real locks, kills real backends,
installs a real trigger, raises where a process would die, or asks the provider for its own
injected network failure.

``crash_under_exit`` (case C23, only when named: :data:`OPT_IN_FAULTS`) runs under ``durability="exit"``: the
crash after the business commit leaves no checkpoint, the prompt is sent again with new tool call ids,
and a call without a natural key applies twice under every preset.

The concurrency family (:data:`CONCURRENCY_FAULTS`: ``same_thread_runs``, ``double_submit``,
``lost_update``, ``check_then_act``, ``write_skew``) runs two conversations at once on one customer,
their interleaving forced by a rendezvous between real transactions (:mod:`agentlab.lab.concurrency`).
It is selected by name and is not part of :data:`FAULTS`, the default rows of the chaos table.

``get_fault(name)``,         :data:`FAULTS`; :meth:`agentlab.lab.runner.Lab.run` injects one into an episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from psycopg import sql
from psycopg_pool import PoolClosed, PoolTimeout

from agentlab.domains.billing.limits import WRITE_CREDIT
from agentlab.domains.billing.scenarios import C, Intended, PlannedCall, Scenario, get_scenario
from agentlab.domains.billing.tools import CREATE_REFUND


SERVER_GONE = (PoolClosed, PoolTimeout, psycopg.OperationalError)
"""What a fault's background controller meets when the server (or the process's pool) is gone."""

EpisodeRunLike = Any  # an agentlab.lab.runner.EpisodeRun: the episode a fault acts on

FAMILIES: tuple[str, ...] = (
    "hallucinated_argument", "check_violation", "unique_violation", "fk_violation", "lock_timeout",
    "statement_timeout", "backend_killed", "crash_before_checkpoint", "crash_mid_node", "provider_timeout",
    "worker_crash", "provider_forgot_key",
)
CLEAN_SCENARIOS = ("refund", "invoice", "topup", "batch")
POLL_S = 0.01  # how often a fault's controller looks at the server
WAIT_CAP_S = 8.0  # a controller gives up waiting for the episode after this long


@dataclass(frozen=True)
class Fault:
    """One named fault. Subclasses override the phases they need.

    Attributes:
        name: the fault's name (a row of the chaos table).
        family: which of the twelve :data:`FAMILIES` it belongs to (or ``"control"``).
        title: one line: what happens.
        guarded_by: the safeguard expected to hold it (documentation; nothing reads it to decide).
        scenarios: scenarios it fits; an episode picks one with its seed.
        resumes: the episode crashes and resumes from a checkpoint (needs one per super-step).
    """

    name: str
    family: str
    title: str
    guarded_by: str
    scenarios: tuple[str, ...] = CLEAN_SCENARIOS

    resumes = False
    forced_durability = None  # the LangGraph durability the fault needs (None: the runner's choice)
    resubmits = False  # a resume that finds no checkpoint sends the prompt again (with new tool call ids)

    def resumes_graph(self, safeguards) -> bool:
        """Whether the episode's graph may crash and resume from a checkpoint under ``safeguards`` (it then
        needs a checkpoint per super-step)."""
        return self.resumes

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        """The scenario the model will play (hallucinations go here). Pure."""
        return scenario

    def episode_safeguards(self, safeguards):
        """The safeguards the episode runs under: ``safeguards`` itself, unless the fault scales a timeout
        down so that the lab waits less (every switch and the name stay). Pure."""
        return safeguards

    async def install(self, pool) -> None:
        """Database objects the fault needs, created once per database (idempotent)."""

    async def arm(self, run: "EpisodeRunLike") -> None:
        """Inject the fault into ``run`` before the graph starts."""

    async def before_restart(self, run: "EpisodeRunLike") -> None:
        """Runs after the crash and before the new process resumes the thread."""

    async def disarm(self, run: "EpisodeRunLike") -> None:
        """Remove whatever the fault left behind (always runs)."""


# --------------------------------------------------------------------------- hallucinated arguments

@dataclass(frozen=True)
class Hallucination(Fault):
    """One planned call of ``tool`` gets a bad value for ``field``; ``fix`` is the original call."""

    tool: str = "ApplyCredit"
    field: str = "amount_cents"
    corrupt: Callable[[Any, Scenario], Any] | None = None
    later_only: bool = False  # only calls after the first of their step (so siblings ran before them)

    def targets(self, scenario: Scenario) -> list[tuple[int, int, PlannedCall]]:
        return [(s, k, c) for s, k, c in scenario.calls()
                if (self.tool == "*" or c.tool == self.tool) and self.field in c.args and (k > 0 or not self.later_only)]

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        bad = dict(call.args)
        bad[self.field] = self.corrupt(call.args[self.field], scenario)
        return scenario.with_call(step, index, args=bad, fix=dict(call.args))


def _major_units(cents: int, scenario: Scenario) -> float:
    return cents / 100  # 2500 cents sent as 25.0: a decimal in the currency's major unit


def _negative(cents: int, scenario: Scenario) -> int:
    return -cents


def _stray_quote(customer: C, scenario: Scenario) -> C:
    return C(customer.index, quote=True)


@dataclass(frozen=True)
class OtherTenant(Hallucination):
    """The model names a customer of another tenant: one the episode creates, so no episode shares it
    (:func:`agentlab.lab.tenancy.with_foreign_customer`); told "not found", it sends the right customer."""

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        from agentlab.lab.tenancy import with_foreign_customer

        step, index, _ = rng.choice(self.targets(scenario))
        return with_foreign_customer(scenario, step, index)


@dataclass(frozen=True)
class OverBalance(Hallucination):
    """The model deducts more than the customer's credit: the CHECK on the balance is what refuses it."""

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        opening = scenario.customers[call.args["customer_id"].index].credit_cents
        return scenario.with_call(step, index, args={**call.args, "amount_cents": opening + 1000}, fix=dict(call.args))


@dataclass(frozen=True)
class MissingInvoice(Hallucination):
    """The model attaches a credit memo to an invoice id it made up (the FOREIGN KEY refuses it)."""

    tool: str = "CreateCreditMemo"
    field: str = "customer_id"

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        invented = 7_000_000_000 + rng.randrange(1_000_000)  # no invoice has such an id
        return scenario.with_call(step, index, args={**call.args, "invoice_id": invented}, fix=dict(call.args))


@dataclass(frozen=True)
class RepeatNaturalKey(Fault):
    """After its work, the model creates one record again under the same natural key, as an LLM does
    when it is not sure the first call went through."""

    tools: tuple[str, ...] = ("CreateInvoice", "CreateCreditMemo")

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        _, _, call = rng.choice([t for t in scenario.calls() if t[2].tool in self.tools])
        return scenario.with_step((PlannedCall(call.tool, dict(call.args)),))


@dataclass(frozen=True)
class ScenarioFault(Fault):
    """The fault is the scenario itself (dependent calls sent in the wrong order)."""


# --------------------------------------------------------------------------- locks and timeouts

def _sizing_ms(run: "EpisodeRunLike", attr: str) -> float:
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

    async def arm(self, run: "EpisodeRunLike") -> None:
        locked = asyncio.Event()
        hold_s = _sizing_ms(run, "lock_timeout_ms") / 1000 + self.margin_s
        customer = run.customer_ids[0]
        query = sql.SQL(LOCK_ROW).format(schema=sql.Identifier(run.schema))

        async def hold() -> None:
            async with run.pool.connection() as conn, conn.transaction():
                await conn.execute(query, (customer,))
                run.notes["locked_customer"] = customer
                locked.set()
                loop = asyncio.get_running_loop()
                deadline = loop.time() + WAIT_CAP_S
                while loop.time() < deadline:
                    if (await (await conn.execute(SOMEONE_WAITS_ON_ME)).fetchone())[0]:
                        run.notes["waiter_seen"] = True
                        await asyncio.sleep(hold_s)
                        break
                    await asyncio.sleep(POLL_S)
            run.notes["lock_held_s"] = hold_s

        task = asyncio.create_task(hold())
        run.background.append(task)
        waiter = asyncio.create_task(locked.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # the holder failed before it had the lock: raise why

    async def disarm(self, run: "EpisodeRunLike") -> None:
        await _finish(run.background)


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

    async def arm(self, run: "EpisodeRunLike") -> None:
        await self.install(run.pool)
        customer = run.customer_ids[0]
        slow_s = self.statement_timeout_ms / 1000 + self.margin_s
        async with run.pool.connection() as conn:
            await conn.execute(slow_shot(customer))
            await conn.execute(SLOW_ARM, (customer,))
        run.notes["slow_customer"] = customer

        async def control() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_CAP_S
            try:
                while loop.time() < deadline:
                    async with run.pool.connection() as conn:
                        seen = (await (await conn.execute(SLOW_SEEN, (customer,))).fetchone())[0]
                    if seen:
                        run.notes["slow_statement_seen"] = True
                        await asyncio.sleep(slow_s)
                        break
                    await asyncio.sleep(POLL_S)
            except SERVER_GONE:  # the server stopped: the episode meets that itself; nothing left to control
                run.notes["controller_lost_server"] = True
            finally:
                with contextlib.suppress(*SERVER_GONE):  # shutting down (Ctrl-C) or no server: nothing to disarm on
                    async with run.pool.connection() as conn:
                        await conn.execute(SLOW_DISARM, (customer,))
                        await conn.execute(slow_shot(customer, drop=True))
                run.notes["slow_s"] = slow_s

        run.background.append(asyncio.create_task(control()))

    async def disarm(self, run: "EpisodeRunLike") -> None:
        await _finish(run.background)


async def _finish(tasks: list) -> None:
    """Wait for a fault's background tasks (cancel one that outlives its cap); raise what one raised.
    Cancelled itself (the episode is), it cancels them too: none outlives its episode."""
    try:
        for task in tasks:
            if not task.done():
                done, _ = await asyncio.wait([task], timeout=WAIT_CAP_S + 2)
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

    def __init__(self, pool, run: "EpisodeRunLike"):
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

    async def arm(self, run: "EpisodeRunLike") -> None:
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


@dataclass(frozen=True)
class CrashAfterCommit(Fault):
    """The process dies right after the first batch's COMMIT returned, before LangGraph writes the
    super-step's checkpoint; the thread resumes from its last checkpoint in a new process."""

    resumes = True

    async def arm(self, run: "EpisodeRunLike") -> None:
        async def die(calls) -> None:
            if not run.notes.get("crashes"):
                raise run.crash("after the business commit, before the checkpoint write")

        run.node.hooks.after_commit.append(die)


@dataclass(frozen=True)
class CrashUnderExitDurability(CrashAfterCommit):
    """Case C23: the episode runs with LangGraph ``durability="exit"`` (a checkpoint only when a run ends) and
    the process dies right after the first batch's COMMIT. The new process finds no checkpoint, so
    nothing to resume (LangGraph's ``EmptyInputError``); the user sends the prompt again and the model
    sends the work again under new tool call ids, which the ledger cannot recognise. Natural keys refuse
    a second credit memo, invoice or refund; ``ApplyCredit`` has none, so its deduction is applied twice
    under every preset (``balance_mismatch``), and the first run's ledger rows answer no call of the
    thread (``ledger_mismatch``). The safeguard is not a preset: run with ``"sync"`` or ``"async"``."""

    forced_durability = "exit"
    resubmits = True


@dataclass(frozen=True)
class CrashMidNode(Fault):
    """The process dies before call ``at_call`` of a batch (inside its transaction); the thread
    resumes from its last checkpoint in a new process."""

    at_call: int = 1
    resumes = True

    async def arm(self, run: "EpisodeRunLike") -> None:
        async def die(call, index: int) -> None:
            if index == self.at_call and not run.notes.get("crashes"):
                raise run.crash(f"mid-node, before call {index + 1}")

        run.node.hooks.before_call.append(die)


# --------------------------------------------------------------------------- the provider

PAYMENT_SCENARIOS = ("refund", "invoice", "topup", "batch")  # the first customer is paid or refunded


@dataclass(frozen=True)
class ProviderTimeoutAfterSuccess(Fault):
    """The provider performs the episode's first payment, then the caller's request times out."""

    scenarios: tuple[str, ...] = PAYMENT_SCENARIOS

    async def arm(self, run: "EpisodeRunLike") -> None:
        run.provider.fail_next("timeout_after_success", customer_id=run.customer_ids[0])
        run.notes["provider_fault"] = "timeout_after_success"

    async def disarm(self, run: "EpisodeRunLike") -> None:
        run.notes["provider_fault_unused"] = run.provider.clear_faults(customer_id=run.customer_ids[0])


class DiesAfterPayment:
    """The provider as a process sees it, the process dying once a payment call has returned (once per run).

    ``run`` is an episode run (``crash(where)``, ``notes``); ``where`` says where the process died;
    ``note_payment`` records the returned payment's id as ``notes["paid_before_crash"]``."""

    def __init__(self, provider, run: "EpisodeRunLike", *,
                 where: str = "after the provider call, before the batch commit", note_payment: bool = True):
        self._provider, self._run = provider, run
        self._where, self._note_payment = where, note_payment

    def __getattr__(self, name):
        return getattr(self._provider, name)

    async def _after(self, response: dict) -> dict:
        if not self._run.notes.get("crashes"):
            if self._note_payment:
                self._run.notes["paid_before_crash"] = response["id"]
            raise self._run.crash(self._where)
        return response

    async def create_charge(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_refund(*args, **kwargs))


@dataclass(frozen=True)
class CrashAfterProviderCall(Fault):
    """The process that calls the provider dies after the provider did the work and before recording it:
    the outbox worker (before marking the row dispatched) or, with the outbox off, the tools node
    (before its batch commits). A new process resumes; ``forget_keys`` moves the provider's clock past
    its idempotency-key retention first (the resume comes days later)."""

    forget_keys: bool = False
    scenarios: tuple[str, ...] = PAYMENT_SCENARIOS
    resumes = True

    def resumes_graph(self, safeguards) -> bool:
        return not safeguards.outbox  # with the outbox it is the worker that dies, after the graph finished

    async def arm(self, run: "EpisodeRunLike") -> None:
        if run.safeguards.outbox:
            def die(row_id: int) -> None:
                if not run.notes.get("crashes"):
                    run.notes.setdefault("crashes", []).append("worker, after the provider call")
                    run.notes["row_before_crash"] = row_id
                    from agentlab.core.errors import SimulatedCrash
                    raise SimulatedCrash(f"simulated worker crash after the provider call (row {row_id})")

            run.worker.hooks.after_provider_call.append(die)
        else:
            run.node.provider = DiesAfterPayment(run.node.provider, run)

    async def before_restart(self, run: "EpisodeRunLike") -> None:
        if self.forget_keys:
            days = run.provider.retention_s + 2 * 86400
            run.provider.clock.advance(days)
            run.notes["clock_advanced_s"] = days


# --------------------------------------------------------------------------- the catalog

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("none", "control", "no fault: the control row", "-"),
    Hallucination("wrong_type", "hallucinated_argument", "an amount in major units as a decimal (25.0 for 2500 cents)",
                  "validation", ("refund", "invoice", "batch"), corrupt=_major_units),
    Hallucination("negative_amount", "hallucinated_argument", "a negative amount sent to a deduction",
                  "validation", ("refund", "invoice", "batch"), corrupt=_negative),
    Hallucination("stray_quote", "hallucinated_argument", "a customer id as text with a stray quote (\"12'\")",
                  "validation", CLEAN_SCENARIOS, tool="*", field="customer_id", corrupt=_stray_quote, later_only=True),
    OtherTenant("other_tenant_id", "hallucinated_argument", "a customer id of another tenant",
                "isolation (row-level security)", ("refund", "invoice", "batch")),
    OverBalance("check_violation", "check_violation", "a deduction larger than the credit balance (CHECK)",
                "constraints", ("refund", "invoice", "batch")),
    RepeatNaturalKey("unique_violation", "unique_violation", "a record created again under its natural key (UNIQUE)",
                     "constraints"),
    MissingInvoice("fk_violation", "fk_violation", "a credit memo for an invoice id that does not exist (FOREIGN KEY)",
                   "constraints", ("refund", "topup")),
    LockHolder("lock_timeout", "lock_timeout", "a second session holds the customer's row lock", "timeouts"),
    SlowStatement("statement_timeout", "statement_timeout", "the customer's UPDATE runs past the statement timeout",
                  "timeouts"),
    KillBackend("backend_killed", "backend_killed", "pg_terminate_backend on the node's backend during call 2",
                "transaction"),
    CrashAfterCommit("crash_before_checkpoint", "crash_before_checkpoint",
                     "crash after the business commit, before the checkpoint; resume in a new process", "ledger"),
    CrashMidNode("crash_mid_node", "crash_mid_node", "crash before call 2 of a batch; resume in a new process",
                 "transaction"),
    ProviderTimeoutAfterSuccess("provider_timeout", "provider_timeout",
                                "the provider charges, then the request times out", "outbox"),
    CrashAfterProviderCall("worker_crash", "worker_crash",
                           "the caller of the provider dies after the call, before recording it", "outbox"),
    CrashAfterProviderCall("provider_forgot_key", "provider_forgot_key",
                           "as worker_crash, resumed days later: the provider forgot the idempotency key", "outbox",
                           forget_keys=True),
    ScenarioFault("wrong_order", "control", "dependent calls sent in the wrong order in one step", "savepoints",
                  ("reorder",)),
)}


OPT_IN_FAULTS: dict[str, Fault] = {f.name: f for f in (
    CrashUnderExitDurability("crash_under_exit", "crash_before_checkpoint",
                             "durability exit: crash after the business commit, no checkpoint; the prompt is sent again",
                             "none (run with durability sync or async)", ("refund", "invoice", "batch")),
)}
"""Faults run only when named (``--faults crash_under_exit``, ``Lab.run("crash_under_exit")``), never by
default: no preset holds them, so they stay out of the table every preset is meant to keep clean."""

# --------------------------------------------------------------------------- two conversations at once

RENDEZVOUS_S = 5.0  # a conversation waits at most this long for the other at its act (agentlab.lab.concurrency);
# each wait ends early in the usual case (the other arrived, ended, or waits on this one's lock), so the bound only
# matters under load: 1 s let a chaos run of 32 episodes at once time out and change its table between runs


@dataclass(frozen=True)
class Concurrent(Fault):
    """Two conversations at once on one customer; :mod:`agentlab.lab.concurrency` runs and checks them.

    Attributes:
        first, second: the planned calls of conversations A and B (None: the scenario's), ``C(i)`` naming
            the customers of the scenario (both conversations act on the same rows).
        same_thread: both conversations run on one thread.
        intended: the end state both conversations together mean to reach (None: the scenario's own).
        acts: the statements the conversations meet at.
    """

    first: tuple[tuple[PlannedCall, ...], ...] | None = None
    second: tuple[tuple[PlannedCall, ...], ...] | None = None
    same_thread: bool = False
    intended: Intended | None = None
    acts: tuple[str, ...] = ()
    conversations = 2

    def scenarios_for(self, scenario: Scenario) -> tuple[Scenario, Scenario]:
        """Conversation A's and B's scenarios (their steps replaced by :attr:`first`, :attr:`second`). Pure."""
        a = scenario if self.first is None else dataclasses.replace(scenario, steps=self.first)
        b = scenario if self.second is None else dataclasses.replace(scenario, steps=self.second)
        return a, b

    def end_state(self, scenario: Scenario) -> Scenario:
        """``scenario`` with the end state both conversations together should reach."""
        return scenario if self.intended is None else dataclasses.replace(scenario, intended=self.intended)


def _redeem(amount: int) -> tuple[tuple[PlannedCall, ...], ...]:
    return ((PlannedCall("RedeemCredit", {"customer_id": C(0), "amount_cents": amount}),),)


def _capped(reference: str, amount: int) -> tuple[tuple[PlannedCall, ...], ...]:
    return ((PlannedCall("RefundWithinCap", {"customer_id": C(0), "reference": reference, "amount_cents": amount}),),)


_NO_RECORDS = {"invoices": (0,), "credit_memos": (0,), "provider_charges": (0,)}

CONCURRENCY_FAULTS: dict[str, Concurrent] = {f.name: f for f in (
    Concurrent("same_thread_runs", "concurrency", "one request submitted twice at once on one thread (C18)",
               "run_lock (one writer per thread for a whole run)", ("redeem",), same_thread=True,
               first=_redeem(2000), second=_redeem(2000),
               intended=Intended(final_credit_cents=(3000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("double_submit", "concurrency", "one refund request submitted twice at once, on two threads",
               "constraints (the natural key: customer and reference)", ("capped_refund",),
               first=_capped("RMA-2001", 2000), second=_capped("RMA-2001", 2000),
               intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS),
               acts=(CREATE_REFUND,)),
    Concurrent("lost_update", "concurrency", "two redemptions read the same balance and write their own result",
               "row_locks or repeatable read", ("redeem",), first=_redeem(2000), second=_redeem(1500),
               intended=Intended(final_credit_cents=(1500,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("check_then_act", "concurrency", "two redemptions each pass the balance check, together they exceed it",
               "row_locks or repeatable read", ("redeem",), first=_redeem(3000), second=_redeem(3000),
               intended=Intended(final_credit_cents=(2000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("write_skew", "concurrency", "two refunds each pass the daily cap check, together they exceed it",
               "row_locks or serializable", ("capped_refund",), first=_capped("RMA-2001", 3000),
               second=_capped("RMA-2002", 3000),
               intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS),
               acts=(CREATE_REFUND,)),
)}
CONCURRENCY_FAMILY = tuple(CONCURRENCY_FAULTS)
"""Faults of real concurrency (:mod:`agentlab.lab.concurrency`): two conversations at once on one customer.
Selectable by name (``chaos --faults ...``); not in :data:`FAULTS`, the default table's rows."""


GENERIC_FAULTS = ("none", "backend_killed", "crash_before_checkpoint", "crash_mid_node")
"""Faults that need nothing of a domain but its tools node: they fit every domain and scenario."""


def faults_for(domain) -> tuple[str, ...]:
    """The names of the catalog's faults that fit ``domain`` (an :class:`agentlab.core.domain.Domain`):
    every fault for billing (the catalog was written for it), else the generic faults plus the ones the
    domain lists in ``faults``."""
    if domain is None or domain.name == "billing":
        return tuple(FAULTS)
    return tuple(dict.fromkeys((*GENERIC_FAULTS, *(domain.faults or ()))))


DOMAIN_RACES = ("retail",)
"""Domains whose concurrency faults play races of their own (:mod:`agentlab.domains.retail.concurrency`,
run by :func:`agentlab.lab.concurrency.run_retail_concurrent`)."""


def domain_races(domain, fault_name: str) -> tuple[str, ...]:
    """The names of ``domain``'s races for ``fault_name``. Raises ValueError when the fault does not apply to
    the domain (retail's ``write_skew``), naming why."""
    from agentlab.domains.retail.concurrency import NOT_APPLICABLE, RACES

    if fault_name in NOT_APPLICABLE:
        raise ValueError(f"fault {fault_name!r} does not apply to domain {domain.name!r}: {NOT_APPLICABLE[fault_name]}")
    return tuple(r.name for r in RACES[fault_name])


def fault_scenarios(fault: Fault, domain) -> tuple[str, ...]:
    """The scenarios of ``domain`` an episode under ``fault`` may play. Raises ValueError when the fault
    does not fit the domain."""
    if domain is None or domain.name == "billing":
        return fault.scenarios
    if isinstance(fault, Concurrent) and domain.name in DOMAIN_RACES:  # retail's races (domains.retail.concurrency)
        return domain_races(domain, fault.name)
    if fault.name not in faults_for(domain):
        raise ValueError(f"fault {fault.name!r} does not fit domain {domain.name!r}; its faults: "
                         f"{', '.join(faults_for(domain))}")
    return tuple(domain.scenarios)


def injected_by_script(fault: Fault) -> bool:
    """Whether ``fault`` is injected through the scripted model's calls (a hallucination, a repeated natural
    key, a wrong order): a real model decides its own calls, so such a fault cannot be given to one."""
    return type(fault).prepare is not Fault.prepare or isinstance(fault, ScenarioFault)


def get_fault(name: str) -> Fault:
    """The named fault (of :data:`FAULTS` or :data:`CONCURRENCY_FAMILY`). Raises ValueError naming the known faults."""
    if name in CONCURRENCY_FAULTS:
        return CONCURRENCY_FAULTS[name]
    try:
        return FAULTS[name] if name in FAULTS else OPT_IN_FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; choose one of: {', '.join((*FAULTS, *OPT_IN_FAULTS, *CONCURRENCY_FAMILY))}") from None


def fault_table() -> list[dict[str, str]]:
    """The catalog as rows (name, family, title, guarded_by, scenarios), for a notebook or the CLI."""
    return [{"fault": f.name, "family": f.family, "title": f.title, "guarded_by": f.guarded_by,
             "scenarios": ", ".join(f.scenarios)} for f in FAULTS.values()]


def check_catalog() -> None:
    """Raise AssertionError when a fault names an unknown scenario or a family outside :data:`FAMILIES`."""
    for f in [*FAULTS.values(), *OPT_IN_FAULTS.values()]:
        for s in f.scenarios:
            get_scenario(s)
        assert f.family in (*FAMILIES, "control"), f.name
    assert set(FAMILIES) <= {f.family for f in FAULTS.values()}
