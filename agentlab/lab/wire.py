"""The network between an agent and its outside world, as the yardstick fixes it: one order of events.

An agent that sends its tool calls concurrently (LangGraph's ``ToolNode`` gathers them, LangChain's
``create_agent`` runs each as its own task) races them against the database and the payment
provider: which sibling commits before another's error cancels the rest changes from run to run. The
yardstick puts each agent process behind a :class:`Wire` (statements reach PostgreSQL in the order
they were sent, answers come back after a latency, in that order) and the provider behind a
:class:`NetworkProvider` (a request travels before the provider performs it), so the same seed gives
the same table. The order it fixes is the one the calls were sent in; the real world also allows the
others.

Sources: psycopg "Connection pools" (``connection_class``, ``configure``); asyncio "Futures".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

PROVIDER_LATENCY_S = 0.05  # the payment request's trip to the provider, before it does the work
DB_LATENCY_S = 0.02  # an answer from PostgreSQL reaches the agent this long after the server finished
ORDER_WAIT_S = 0.25  # how long the wire holds a statement or an answer back for the order (then lets it go)


class Wire:
    """The network between an agent process and PostgreSQL, as the lab fixes it.

    Statements sent concurrently (``ToolNode``'s sibling calls, ``create_agent``'s tasks) reach the
    server one after another in the order they were sent; an answer arrives ``latency_s`` seconds after
    the server finished, once every statement sent so far has finished too, answers in the order sent
    and at least ``latency_s`` apart (what one answer sets off, a sibling's error cancelling the rest,
    settles before the next arrives).
    So every call of a batch has done its work on the server before the agent reads the first answer,
    and the first failure it reads is the first call's: the order of events, hence the table, is the
    same on every run, however loaded the machine. A statement blocked on a lock or a slow trigger
    holds the others back for ``order_wait_s`` seconds at most. The real world lets these race (which
    sibling commits before an error cancels the rest); the lab shows one fixed order of them, the one
    the calls were sent in."""

    def __init__(self, latency_s: float = DB_LATENCY_S, order_wait_s: float = ORDER_WAIT_S):
        self.latency_s, self.order_wait_s = latency_s, order_wait_s
        self._ran: asyncio.Future | None = None
        self._answered: asyncio.Future | None = None
        self._running: set[asyncio.Future] = set()
        self._open: set[asyncio.Future] = set()  # carries entered and not yet returned (answer not read)
        self._answered_at = float("-inf")
        self.also_wait_for: Callable[[], Iterable[asyncio.Future]] = tuple  # see NetworkProvider

    def in_flight(self) -> list[asyncio.Future]:
        """Futures of the carries under way (sent, their answer not yet delivered): done when each returns."""
        return [f for f in self._open if not f.done()]

    async def carry(self, send: Callable[[], Any]):
        """Run ``send()`` (a psycopg ``execute``, or a provider's call) in order; deliver its answer in order."""
        loop = asyncio.get_running_loop()
        ran_before, answered_before = self._ran, self._answered
        self._ran = ran = loop.create_future()
        self._answered = answered = loop.create_future()
        self._running.add(ran)
        self._open.add(answered)
        try:
            if ran_before is not None and not ran_before.done():
                await _wait_unstalled([ran_before], self.order_wait_s)
            try:
                return await send()
            finally:
                _finish(ran)
                self._running.discard(ran)
                await asyncio.sleep(self.latency_s)
                left_s = self.order_wait_s
                while left_s > 0:  # again while what it waited on set off more (a request on its way)
                    waits = [f for f in (*self._running, answered_before, *self.also_wait_for())
                             if f is not None and f is not answered and not f.done()]
                    if not waits:
                        break
                    left_s = await _wait_unstalled(waits, left_s)
                gap = self._answered_at + self.latency_s - loop.time()
                if gap > 0:  # answers at least latency_s apart: what one answer sets off settles first
                    await asyncio.sleep(gap)
                self._answered_at = loop.time()
        finally:
            _finish(ran)
            self._running.discard(ran)
            self._open.discard(answered)
            _finish(answered)


async def _wait_unstalled(futures: list[asyncio.Future], timeout_s: float, slice_s: float = 0.02) -> float:
    """Wait for ``futures`` up to ``timeout_s`` seconds of the event loop's own time: waited in slices of
    ``slice_s``, a slice that overran (the loop was not scheduled: a loaded machine) counts as ``slice_s``.
    A statement blocked on a lock lets the others go after ``timeout_s``; a busy machine does not.
    Returns the seconds of ``timeout_s`` left (0 when it ran out)."""
    loop = asyncio.get_running_loop()
    left = timeout_s
    pending = [f for f in futures if not f.done()]
    while pending and left > 0:
        step = min(slice_s, left)
        t0 = loop.time()
        _, still = await asyncio.wait(pending, timeout=step)
        pending = list(still)
        left -= min(loop.time() - t0, step)
    return max(left, 0.0)


def _finish(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class WiredConnection(psycopg.AsyncConnection):
    """A psycopg connection whose ``execute`` goes through the process's :class:`Wire`."""

    wire: Wire | None = None

    async def execute(self, query, params=None, *, prepare=None, binary=False):
        def send():
            return super(WiredConnection, self).execute(query, params, prepare=prepare, binary=binary)

        return await (self.wire.carry(send) if self.wire is not None else send())


class NetworkProvider:
    """The payment provider across a network: a request travels ``latency_s`` seconds before the provider
    performs it (a real provider answers in tens to hundreds of milliseconds), then goes through a
    :class:`Wire` of its own (performed in the order sent, answered in that order). It fixes the order of
    what races a payment in flight (a sibling call's error cancelling it), so the same seed gives the
    same table.

    Once ``process_wire`` names the agent process's :class:`Wire` (one process uses the provider), an
    answer is held back (``order_wait_s`` of loop time at most) while another request is on its way to
    the provider or a statement of that process is in flight: a sibling call still reading its invoice when the first call's provider
    error arrives goes on to make its own request first, whatever the machine's load (the first answer
    read sets off the cancellations; everything the batch sent is done by then)."""

    def __init__(self, provider, latency_s: float = PROVIDER_LATENCY_S):
        self._provider, self.latency_s = provider, latency_s
        self.wire = Wire()
        self.wire.also_wait_for = self._elsewhere
        self.process_wire: Wire | None = None
        self._travelling: set[asyncio.Future] = set()

    def __getattr__(self, name):
        return getattr(self._provider, name)

    def _elsewhere(self) -> list[asyncio.Future]:
        if self.process_wire is None:  # two processes share this provider (the concurrency family): no hold,
            return []                  # their order is the rendezvous's to fix
        return [*self.process_wire.in_flight(), *(f for f in self._travelling if not f.done())]

    async def _send(self, call: Callable[[], Any]) -> dict:
        on_its_way = asyncio.get_running_loop().create_future()
        self._travelling.add(on_its_way)
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self._travelling.discard(on_its_way)
            _finish(on_its_way)
        return await self.wire.carry(call)

    async def create_charge(self, *args, **kwargs) -> dict:
        return await self._send(lambda: self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        return await self._send(lambda: self._provider.create_refund(*args, **kwargs))
