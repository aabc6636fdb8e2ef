"""A connection budget: one setting, ``AGENTLAB_MAX_CONNECTIONS``, bounds what one process asks of the server.

On a room's shared server each attendee's role has a connection limit (``CONNECTION LIMIT``, see
:mod:`agentlab.runtime.room`); a notebook whose pools and experiments grow past it is refused with SQLSTATE
53300 "too many connections for role". With the setting ``B`` (a whole number, at least :data:`MIN_BUDGET`, 5):

- every pool the kit makes (:func:`agentlab.core.pools.connection_pool`) keeps no idle connection (a
  ``psycopg_pool.AsyncNullConnectionPool``: a connection lives while it is borrowed) and opens each one
  through one process-wide gate of :func:`pooled_slots` ``= max(1, B - RESERVED)`` connections
  (:class:`BudgetedConnection`), so all the pools of a process together never hold more; the
  :data:`RESERVED` others are for the kit's short checks outside the pools (creating the database, probes);
- every experiment runs at most :func:`capped` episodes at once, in one process.

Unset (the default), nothing changes: the pools and the concurrency are the callers' own.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

import psycopg

from agentlab.core.errors import AgentlabError

ENV_VAR = "AGENTLAB_MAX_CONNECTIONS"
RESERVED = 2  # connections of the budget left outside the pools: the admin connection, a reachability probe
CONNECTIONS_PER_EPISODE = 3  # an episode's nested borrowings at most (tools, checkpointer, provider)
MIN_BUDGET = RESERVED + CONNECTIONS_PER_EPISODE  # below it one episode's nested borrowings wait on each other
WAIT_S = 30.0  # how long a pool waits for a slot of the gate, as long as psycopg_pool waits for a connection


class BudgetSettingInvalid(AgentlabError):
    """Raised when ``AGENTLAB_MAX_CONNECTIONS`` is set but is not a whole number of at least :data:`MIN_BUDGET`."""


class BudgetExhausted(AgentlabError):
    """Raised when every connection of the budget stayed in use for :data:`WAIT_S` seconds."""


def connection_budget() -> int | None:
    """``AGENTLAB_MAX_CONNECTIONS`` as a number, or None when it is unset or empty.

    Raises:
        BudgetSettingInvalid: it is set to something else than a whole number of at least 1.
    """
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < MIN_BUDGET:  # measured: at 3 an episode holding its one pooled slot waited for a second one
        raise BudgetSettingInvalid(
            f"{ENV_VAR} must be a whole number of at least {MIN_BUDGET} (connections: {RESERVED} for the kit's checks, "
            f"{CONNECTIONS_PER_EPISODE} for one episode's tools, checkpoint and provider at once), got {text!r}")
    return value


def pooled_slots() -> int | None:
    """How many connections all the pools of this process may hold at once, or None without a budget."""
    budget = connection_budget()
    return None if budget is None else max(1, budget - RESERVED)


def pool_cap() -> int | None:
    """The most episodes an experiment runs at once under the budget (None: no budget)."""
    slots = pooled_slots()
    return None if slots is None else max(1, slots // CONNECTIONS_PER_EPISODE)


def capped(size: int) -> int:
    """``size`` (a pool's ``max_size`` or an experiment's concurrency), lowered to :func:`pool_cap`."""
    cap = pool_cap()
    return size if cap is None else max(1, min(size, cap))


_lock = threading.Lock()
_gate: tuple[int, threading.BoundedSemaphore] | None = None


def _semaphore(slots: int) -> threading.BoundedSemaphore:
    global _gate
    with _lock:
        if _gate is None or _gate[0] != slots:  # first use, or the setting changed (a test, a notebook cell)
            _gate = (slots, threading.BoundedSemaphore(slots))
        return _gate[1]


class BudgetedConnection(psycopg.AsyncConnection):
    """An ``AsyncConnection`` that holds one slot of the process-wide gate from connect to close."""

    _slot: threading.BoundedSemaphore | None = None

    @classmethod
    async def connect(cls, *args, **kwargs):
        gate = _semaphore(pooled_slots() or 1)
        deadline = time.monotonic() + WAIT_S
        delay = 0.002
        while not gate.acquire(blocking=False):
            if time.monotonic() > deadline:
                raise BudgetExhausted(
                    f"all {pooled_slots()} pooled connections of {ENV_VAR}={connection_budget()} stayed in use "
                    f"for {WAIT_S:.0f} s; raise {ENV_VAR} or run fewer things at once")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        try:
            conn = await super().connect(*args, **kwargs)
        except BaseException:
            gate.release()
            raise
        conn._slot = gate
        return conn

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            slot, self._slot = self._slot, None
            if slot is not None:
                slot.release()
