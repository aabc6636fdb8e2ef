"""Crashes by real process death: the process running the agent calls ``os._exit`` where a machine would lose
power, and a new process recovers the thread. An in-process exception (:class:`agentlab.core.errors.
SimulatedCrash`) is the fast stand-in the notebooks use; this is the proof that the pattern holds when nothing
of the process survives, not its ``finally`` blocks, not its buffered writes, not its background tasks.

- A **death flag** is a row of ``lab_death_flags``: armed by the lab before the agent's process starts, claimed
  (``fired_at`` set, in one autocommit UPDATE) by the process that reaches the fault's point. Only the claimer
  dies, so each fault fires once across processes whichever process gets there first.
- :class:`DiesInsideStep` (``crash_inside_step``): the tools step's effects are committed, the step's result
  reaches the checkpointer, and the process dies before it is recorded. The agent runs in a child process
  (:mod:`agentlab.lab.clients.process_death`); a new child resumes the thread from its last checkpoint, or,
  when there is none (LangGraph durability ``"exit"``), the user sends the prompt again.

Sources: Python docs ``os._exit`` (exit "without calling cleanup handlers, flushing stdio buffers, etc.");
LangGraph docs "Persistence" (durability modes).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from agentlab.lab.nemesis.base import Fault

EXIT_CODE = 99
"""The exit status of a process the nemesis killed (any other non-zero status is the agent's own failure)."""

DEATH_FLAGS = """
CREATE TABLE IF NOT EXISTS public.lab_death_flags (
    name text PRIMARY KEY,
    armed_at timestamptz NOT NULL DEFAULT now(),
    fired_at timestamptz,
    fired_pid integer
)"""

ARM = "INSERT INTO public.lab_death_flags (name) VALUES (%s) ON CONFLICT (name) DO UPDATE SET fired_at = NULL, fired_pid = NULL"
CLAIM = ("UPDATE public.lab_death_flags SET fired_at = now(), fired_pid = %s WHERE name = %s AND fired_at IS NULL"
         " RETURNING name")
FIRED = "SELECT fired_at IS NOT NULL, fired_pid FROM public.lab_death_flags WHERE name = %s"
DISARM = "DELETE FROM public.lab_death_flags WHERE name = %s"


def flag_name(thread_id: str, fault_name: str) -> str:
    """The death flag of one episode's fault."""
    return f"{thread_id}:{fault_name}"


async def claim(conn, name: str) -> bool:
    """Claim death flag ``name`` on ``conn`` (an autocommit ``psycopg.AsyncConnection``): True for the one
    process that gets it (it must die now), False once it has fired or when it was never armed."""
    cur = await conn.execute(CLAIM, (os.getpid(), name))
    return await cur.fetchone() is not None


def claim_now(conninfo: str, name: str) -> bool:
    """:func:`claim` from synchronous code (an engine's hook), on a connection of its own to ``conninfo``."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(CLAIM, (os.getpid(), name)).fetchone() is not None


def die() -> None:
    """Die now, as a process that lost its machine: no cleanup, no flush, no ``finally`` (exit status
    :data:`EXIT_CODE`)."""
    sys.stderr.flush()
    os._exit(EXIT_CODE)


@dataclass(frozen=True)
class DiesInsideStep(Fault):
    """The process running the agent dies for real once a tools step's effects are committed and its result
    reaches the checkpointer, before the checkpoint records it; a new process recovers the thread (from its
    last checkpoint, or, with none, the user sends the prompt again: ``resubmits``)."""

    resumes = True
    resubmits = True
    process_death = True  # played by a client whose agent lives in a child process

    async def install(self, pool) -> None:
        async with pool.connection() as conn:
            await conn.execute(DEATH_FLAGS)

    async def arm(self, run) -> None:
        async with run.pool.connection() as conn:
            await conn.execute(ARM, (flag_name(run.thread_id, self.name),))

    async def disarm(self, run) -> None:
        async with run.pool.connection() as conn:
            cur = await conn.execute(FIRED, (flag_name(run.thread_id, self.name),))
            row = await cur.fetchone()
            if row is not None and row[0]:
                run.notes["death"] = {"pid": row[1], "exit_code": EXIT_CODE}
            await conn.execute(DISARM, (flag_name(run.thread_id, self.name),))


CRASH_INSIDE_STEP = DiesInsideStep(
    "crash_inside_step", "crash_before_checkpoint", "the process really dies (os._exit) after the tools step "
    "committed, before its result is recorded; a new process recovers the thread", "ledger")
