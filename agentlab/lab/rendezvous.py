"""The rendezvous: a barrier that forces two conversations' transactions into one interleaving.

A fault of real concurrency (:mod:`agentlab.lab.concurrency`) runs two conversations at once on the same
rows; a :class:`Rendezvous` sits in front of each conversation's tools node connections (:meth:`Rendezvous.wrap`)
so that the interleaving that breaks a first draft is forced, not hoped for. The first statement that matches
the fault's *act* (:func:`meets_at`: the write after the read, the balance ``UPDATE``, the refund ``INSERT``)
waits until the other conversation has reached its own act too, so both have read before either writes; then
A's act goes first and B's waits until A's batch has ended (r1 r2 w1 c1 w2 c2). A conversation that
cannot arrive because it is blocked by a lock *this* one holds (``pg_blocking_pids``: a row lock, the
thread's advisory lock, a unique index entry) releases the wait at once, and so does one that has
ended (refused by the thread lease, or done), or waits for the thread lease this one's run holds
(``run_lock_wait_ms``). The wait is bounded by :data:`agentlab.lab.faults.RENDEZVOUS_S` seconds (``timeout_s``),
polled every :data:`POLL_S` seconds; a party that passed once never waits again (a retried batch runs freely).
Same seed, same interleaving, same table.

The yardstick's two runs at once (:mod:`agentlab.lab.yardstick_concurrency`) meet at the same barrier.

Sources: PostgreSQL docs "Explicit Locking", "System Information Functions" (``pg_blocking_pids``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from agentlab.lab.faults import RENDEZVOUS_S

POLL_S = 0.005  # seconds between two looks at the other parties while waiting

BLOCKED_BY = "SELECT %s = ANY(pg_blocking_pids(%s))"


class Rendezvous:
    """A barrier between the conversations of one episode, at the first statement each sends that
    ``acts`` matches. Bounded (``timeout_s``); see the module docstring for when a wait ends early.

    Args:
        pool: a pool for the controller's own queries ("another session").
        parties: the conversation names.
        acts: ``acts(query_text) -> bool``, the statements to meet at (:func:`meets_at`).
    """

    def __init__(self, pool, parties: tuple[str, ...], acts: Callable[[str], bool], *, timeout_s: float = RENDEZVOUS_S):
        self.pool = pool
        self.parties = parties
        self.acts = acts
        self.timeout_s = timeout_s
        self.arrived: set[str] = set()
        self.passed: set[str] = set()
        self.gone: set[str] = set()
        self.finished: set[str] = set()  # parties whose batch holding the act has ended
        self.queued: set[str] = set()  # parties waiting for a thread lease another party's run holds
        self.pids: dict[str, int] = {}
        self.log: list[str] = []  # what happened, in order (for tests and notes)

    def account(self) -> list[str]:
        """:attr:`log` as notes show it: each run of consecutive arrivals ("A at its act", "B at its act")
        in the order of :attr:`parties`. Parties that reach the barrier before any of them goes on meet
        there; which one the event loop ran first is not part of the story, and would make the same forced
        interleaving print two ways. Every other entry keeps its place."""
        out: list[str] = []
        run: list[str] = []
        rank = {p: n for n, p in enumerate(self.parties)}
        for entry in [*self.log, None]:
            if entry is not None and entry.endswith(" at its act"):
                run.append(entry)
                continue
            out.extend(sorted(run, key=lambda e: rank.get(e[:-len(" at its act")], len(rank))))
            run = []
            if entry is not None:
                out.append(entry)
        return out

    def wrap(self, party: str, pool) -> _GatedPool:
        """``pool`` as the party's tools node sees it: its connections meet the others at the act."""
        return _GatedPool(pool, self, party)

    def leave(self, party: str) -> None:
        """``party``'s conversation has ended: nobody waits for it any more."""
        self.gone.add(party)

    async def arrive(self, party: str) -> None:
        """``party`` is at its act. Phase 1: wait until every other party has arrived (or is blocked by a lock
        this party holds, or has ended). Phase 2: a party later in :attr:`parties` then waits until each earlier
        one that arrived has finished the batch holding its act (its connection went back to the pool), is
        blocked by this one, or has ended: the acts run as r1 r2 w1 c1 w2 c2, the same order on every run.
        Each phase waits at most ``timeout_s``."""
        if party in self.passed:
            return
        self.arrived.add(party)
        self.log.append(f"{party} at its act")
        others = [p for p in self.parties if p != party]
        how = await self._until(party, lambda: [p for p in others if p not in self.arrived and p not in self.gone
                                                and p not in self.queued],
                                "all arrived")
        earlier = self.parties[:self.parties.index(party)]
        if how != "timeout" and any(p in self.arrived for p in earlier):
            how = await self._until(party, lambda: [p for p in earlier if p in self.arrived and p not in self.finished
                                                    and p not in self.gone], "the other's act committed first")
        self.passed.add(party)
        self.log.append(f"{party} goes on ({how})")

    async def _until(self, party: str, pending: Callable[[], list[str]], done: str) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while loop.time() < deadline:
            waiting_for = pending()
            if not waiting_for:
                return done
            if await self._blocked_by_me(party, waiting_for):
                return "the other waits on this one's lock"
            await asyncio.sleep(POLL_S)
        # a busy event loop (many episodes at once) may wake this wait only after its deadline: look once more
        return done if not pending() else "timeout"

    async def _blocked_by_me(self, party: str, others: list[str]) -> bool:
        mine = self.pids.get(party)
        if mine is None:
            return False
        async with self.pool.connection() as conn:
            for other in others:
                pid = self.pids.get(other)
                if pid is not None and (await (await conn.execute(BLOCKED_BY, (mine, pid))).fetchone())[0]:
                    return True
        return False


class _GatedConnection:
    """A connection whose ``execute`` meets the other conversations before the fault's act."""

    def __init__(self, conn, gate: Rendezvous, party: str):
        self._conn = conn
        self._gate = gate
        self._party = party

    def __getattr__(self, name):
        return getattr(self._conn, name)

    async def execute(self, query, *args, **kwargs):
        if self._party not in self._gate.passed and isinstance(query, str) and self._gate.acts(query):
            await self._gate.arrive(self._party)
        return await self._conn.execute(query, *args, **kwargs)


class _GatedPool:
    def __init__(self, pool, gate: Rendezvous, party: str):
        self._pool = pool
        self._gate = gate
        self._party = party

    def __getattr__(self, name):
        return getattr(self._pool, name)

    @contextlib.asynccontextmanager
    async def connection(self, *args, **kwargs):
        async with self._pool.connection(*args, **kwargs) as conn:
            self._gate.pids[self._party] = conn.info.backend_pid
            try:
                yield _GatedConnection(conn, self._gate, self._party)
            finally:
                if self._party in self._gate.arrived:
                    self._gate.finished.add(self._party)


def meets_at(*queries: str) -> Callable[[str], bool]:
    """The predicate of a rendezvous that meets at any of ``queries`` (SQL texts, compared stripped)."""
    wanted = {q.strip() for q in queries}
    return lambda q: q.strip() in wanted
