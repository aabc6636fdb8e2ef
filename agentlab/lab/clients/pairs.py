"""Two conversations at once as one client of the lab's one loop: the concurrency family's workload (two runs of
an agent's graph on one customer, met at a rendezvous on the statements they race on).

The pair is played by whoever knows its agent: the kit's graph (:func:`agentlab.lab.concurrency.run_concurrent`)
or a LangGraph agent (:func:`agentlab.lab.yardstick_concurrency.run_two`); :class:`PairClient` hands the loop
their three moves (``play`` both, ``read`` their threads back, make the ``episode``), and the loop adds what
every episode gets: the fault's phases, the outbox drained thread by thread, the check. Nothing in a pair
crashes: no fault of the family kills a process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agentlab.core.outbox import DrainStats, OutboxWorker
from agentlab.lab.loop import RunAccess
from agentlab.runtime.harness import Episode


class ThreadsWorker:
    """The outbox worker of a pair: drains each of ``threads`` in turn (``provider``: the one the runs called)
    and returns the last thread's :class:`agentlab.core.outbox.DrainStats`."""

    def __init__(self, pool, provider, threads: list[str]):
        self.pool, self.provider, self.threads = pool, provider, threads

    async def drain(self) -> DrainStats | None:
        stats = None
        for t in self.threads:
            stats = await OutboxWorker(self.pool, self.provider, thread_id=t).drain()
        return stats


@dataclass
class PairRun(RunAccess):
    """What a fault of the concurrency family reaches: the harness, the preset, the first conversation's thread
    (``thread_id``), the seed, the pair's outbox ``worker`` and ``notes``."""

    harness: Any
    safeguards: Any
    thread_id: str
    seed: int
    worker: ThreadsWorker
    notes: dict[str, Any] = field(default_factory=dict)
    crashed: bool = False
    worker_crashed: bool = False

    def episode_saver(self):
        raise NotImplementedError("the concurrency family crashes no process")


class PairClient:
    """Both conversations as one client: ``await play()`` runs them at once (each records how it ended),
    ``await read()`` returns their end state as the pair's own value, ``episode(state, drain)`` makes the
    :class:`agentlab.runtime.harness.Episode` the checker reads; optional: ``setup`` (the pair's processes, before
    the fault is armed), ``settle`` (after the play), ``flush`` (after the drain), ``teardown`` (always, last)."""

    def __init__(self, run: PairRun, *, play: Callable[[], Awaitable[None]], read: Callable[[], Awaitable[dict]],
                 episode: Callable[[dict, DrainStats | None], Episode],
                 settle: Callable[[], Awaitable[None]] | None = None,
                 flush: Callable[[], Awaitable[None]] | None = None,
                 setup: Callable[[], Awaitable[None]] | None = None,
                 teardown: Callable[[], Awaitable[None]] | None = None):
        self.run = run
        self._play, self._read, self._episode = play, read, episode
        self._settle, self._flush, self._setup, self._teardown = settle, flush, setup, teardown

    def arms_after_build(self, nemesis) -> bool:
        return False

    async def open(self) -> None:
        if self._setup is not None:
            await self._setup()

    async def build(self) -> None:
        pass

    async def invoke(self, prompt: str | None) -> dict | None:
        await self._play()  # each conversation records its own end; the pair's state is read after
        return None

    def describe(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}"

    def record_error(self, exc: BaseException | None) -> None:
        self.run.notes["error"] = None if exc is None else self.describe(exc)

    async def settle(self) -> None:
        if self._settle is not None:
            await self._settle()

    async def recover(self, nemesis) -> None:
        raise NotImplementedError("the concurrency family crashes no process")

    async def resubmit(self) -> None:
        raise NotImplementedError("the concurrency family crashes no process")

    async def state(self) -> dict:
        return await self._read()

    async def new_worker(self) -> OutboxWorker:
        raise NotImplementedError("the concurrency family crashes no worker")

    async def flush(self) -> None:
        if self._flush is not None:
            await self._flush()

    async def close(self) -> None:
        if self._teardown is not None:
            await self._teardown()

    def episode(self, state: dict, drain: DrainStats | None) -> Episode:
        return self._episode(state, drain)
