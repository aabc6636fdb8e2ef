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
from collections.abc import Callable
from typing import Any

import psycopg

PROVIDER_LATENCY_S = 0.05  # the payment request's trip to the provider, before it does the work
DB_LATENCY_S = 0.02  # an answer from PostgreSQL reaches the agent this long after the server finished
ORDER_WAIT_S = 0.05  # a statement waits at most this long for the one sent before it (then goes anyway)


class Wire:
    """The network between an agent process and PostgreSQL, as the lab fixes it.

    Statements sent concurrently (``ToolNode``'s sibling calls, ``create_agent``'s tasks) reach the
    server in the order they were sent, each once the one before it has finished (or after
    ``order_wait_s``, so that a statement blocked on a lock holds none of its siblings for long); an
    answer arrives ``latency_s`` seconds after the server finished, answers in the order sent. So every
    call of a batch has reached the server before the agent reads the first answer, and the first
    failure it reads is the first call's: the order of events, hence the table, is the same on every
    run. The real world lets these race (which sibling commits before an error cancels the rest); the
    lab shows one fixed order of them, the one the calls were sent in."""

    def __init__(self, latency_s: float = DB_LATENCY_S, order_wait_s: float = ORDER_WAIT_S):
        self.latency_s, self.order_wait_s = latency_s, order_wait_s
        self._ran: asyncio.Future | None = None
        self._answered: asyncio.Future | None = None

    async def carry(self, send: Callable[[], Any]):
        """Run ``send()`` (a psycopg ``execute``) in order, then deliver its answer in order."""
        loop = asyncio.get_running_loop()
        ran_before, answered_before = self._ran, self._answered
        self._ran = ran = loop.create_future()
        self._answered = answered = loop.create_future()
        try:
            if ran_before is not None and not ran_before.done():
                await asyncio.wait([ran_before], timeout=self.order_wait_s)
            try:
                return await send()
            finally:
                ran.done() or ran.set_result(None)
                await asyncio.sleep(self.latency_s)
                if answered_before is not None and not answered_before.done():
                    await asyncio.wait([answered_before], timeout=self.order_wait_s)
        finally:
            ran.done() or ran.set_result(None)
            answered.done() or answered.set_result(None)


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
    same table."""

    def __init__(self, provider, latency_s: float = PROVIDER_LATENCY_S):
        self._provider, self.latency_s = provider, latency_s
        self.wire = Wire()

    def __getattr__(self, name):
        return getattr(self._provider, name)

    async def create_charge(self, *args, **kwargs) -> dict:
        await asyncio.sleep(self.latency_s)
        return await self.wire.carry(lambda: self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        await asyncio.sleep(self.latency_s)
        return await self.wire.carry(lambda: self._provider.create_refund(*args, **kwargs))
