"""The nemesis's common ground: the lab's :class:`Fault` (billing's clean scenarios by default), the families,
the controllers' timings and what a controller meets when the server is gone.

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from agentlab.core.domain import Fault as DomainFault

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
WAIT_CAP_S = 60.0  # a controller gives up waiting for the episode after this long (a hang's ceiling, not a timing)
EPISODE_OVER = "_episode_over"  # the run.notes key of the event ended_event() makes and episode_ended() sets


@dataclass(frozen=True)
class Fault(DomainFault):
    """One fault of the lab's catalog (:class:`agentlab.core.domain.Fault`, the phases a subclass overrides),
    fitting billing's clean scenarios unless it names others."""

    scenarios: tuple[str, ...] = CLEAN_SCENARIOS


def ended_event(run: EpisodeRunLike) -> asyncio.Event:
    """The event set when ``run``'s episode is over (:func:`episode_ended`, from the fault's ``disarm``): a
    controller waits for the episode to reach its fault until then, however slow a loaded machine makes it,
    and stops at once when the episode ended without reaching it. Made on first use, in ``arm``."""
    return run.notes.setdefault(EPISODE_OVER, asyncio.Event())


def episode_ended(run: EpisodeRunLike) -> None:
    """Tell the controllers of ``run`` that its episode is over (and drop the event from its notes)."""
    event = run.notes.pop(EPISODE_OVER, None)
    if event is not None:
        event.set()


async def poll_until(over: asyncio.Event, probe: Callable[[], Awaitable[Any]], *, cap_s: float = WAIT_CAP_S,
                     interval_s: float = POLL_S) -> Any:
    """Await ``probe()`` every ``interval_s`` seconds until it answers something true, and return that answer;
    return None once ``over`` is set (the episode ended without reaching the fault: :func:`ended_event`, made
    in ``arm`` and passed here) or ``cap_s`` seconds have passed. The one wait loop of the lab's controllers."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cap_s
    while loop.time() < deadline and not over.is_set():
        found = await probe()
        if found:
            return found
        await asyncio.sleep(interval_s)
    return None
