"""A compiled graph that holds its thread for every run, whoever calls it (case C41).

The thread lease (:mod:`agentlab.core.run_lock`) makes one writer per thread, but only for runs that take
it: the kit's entry points do (``invoke_with_lease``, ``Harness.run_episode``), a user who calls the
compiled graph as LangGraph's documentation does (``await graph.ainvoke(inputs, {"configurable":
{"thread_id": ...}})``) does not, and two such calls at once on one thread both act and fork its checkpoint
chain (langgraph#8796). So the graph takes the lease itself: :class:`LeasedGraph` is the compiled graph
:func:`agentlab.core.graph.build_graph` returns under ``run_lock``, and its ``astream``, through which
``ainvoke``, ``astream_events`` and a resume with ``Command(resume=...)`` all run, does for a run that
carries no token (:data:`agentlab.core.run_lock.RUN_TOKEN_KEY`) what ``invoke_with_lease`` does around it:

1. before LangGraph reads the thread's checkpoint, take the lease (``acquire_lease``), so a refused run
   has read nothing and written nothing, not even its input's checkpoint;
2. run with the token in the config: every batch renews the lease in its own transaction and is refused
   (``LeaseLost``) if the thread was taken over; a task (:func:`agentlab.core.run_lock.keep_alive`)
   renews it every :data:`~agentlab.core.run_lock.HEARTBEAT_INTERVAL_MS` between batches;
3. when the run ends (its end, an ``interrupt()``, an error, a cancellation) release it.

Why here and not in a node: a node runs after LangGraph has loaded the checkpoint and saved the input, so a
run refused there would already have written a checkpoint on the thread; and the tools node reads the token
from the config, which only the caller of the run can set. Why a token of its own and not LangGraph's
``run_id``: the nodes see a ``run_id`` only when the caller passes one, and a resume is a new invocation
anyway; what survives a crash is the thread and its checkpoints, not the run.

A run that carries a token (the kit's entry points) is left alone: its caller holds the lease and releases
it. A run whose process died stops renewing: its short lease (:data:`~agentlab.core.run_lock.HEARTBEAT_TTL_MS`)
expires within seconds, and the next call on the thread (the resume, the re-submitted prompt) waits that out
instead of being refused. A call while the holder is alive is refused with
:class:`~agentlab.core.run_lock.ThreadBusy` as soon as the holder is seen renewing (within about one
heartbeat), or, if the holder ends first, runs after it on its history.

Not covered: ``aupdate_state`` (writes a checkpoint without running the graph) and the synchronous
``invoke`` / ``stream`` (the kit's nodes are async only).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables.config import merge_configs
from langgraph.graph.state import CompiledStateGraph

from agentlab.core.run_lock import (
    HEARTBEAT_INTERVAL_MS,
    HEARTBEAT_TTL_MS,
    ThreadLease,
    acquire_lease,
    keep_alive,
    release_lease,
    run_token,
)

log = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 2  # a pooled connection a server restart broke is discarded; the second gets a fresh one


@dataclass(frozen=True)
class RunLeases:
    """How a :class:`LeasedGraph` holds its thread for a run that carries no token.

    Attributes:
        pool: an ``AsyncConnectionPool`` of autocommit connections on the kit's database.
        wait_ms: how long a run waits for a live holder to end before it is refused (milliseconds).
        ttl_ms: the lease's TTL (milliseconds): how long a crashed run keeps its thread.
        heartbeat_ms: how often the lease is renewed while the run lives (milliseconds).
    """

    pool: Any
    wait_ms: int = 0
    ttl_ms: int = HEARTBEAT_TTL_MS
    heartbeat_ms: int = HEARTBEAT_INTERVAL_MS


class LeasedGraph(CompiledStateGraph):
    """A ``CompiledStateGraph`` whose every run holds its thread's lease (see the module docstring).

    Build it with :meth:`of`; ``with_config`` and ``copy`` keep the class and its :attr:`run_leases`.
    """

    def __init__(self, *, run_leases: RunLeases, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_leases = run_leases

    @classmethod
    def of(cls, compiled: CompiledStateGraph, run_leases: RunLeases) -> LeasedGraph:
        """``compiled`` (from ``StateGraph.compile``) as a LeasedGraph: the same nodes, channels and
        checkpointer (built the way LangGraph's own ``copy`` builds one)."""
        attrs = {k: v for k, v in compiled.__dict__.items() if k != "__orig_class__"}
        return cls(run_leases=run_leases, **attrs)

    async def astream(self, input: Any, config: Any = None, **kwargs: Any):
        """LangGraph's ``astream``, as one run holding the thread when ``config`` carries no run token.

        Raises:
            agentlab.core.run_lock.ThreadBusy: another run holds the thread; nothing of this run was
                read or written.
        """
        conf = merge_configs(self.config, config).get("configurable") or {}
        thread_id = conf.get("thread_id")
        if thread_id is None or run_token({"configurable": conf}) is not None:
            async for part in super().astream(input, config, **kwargs):
                yield part
            return
        leases = self.run_leases
        lease = await acquire_lease(leases.pool, str(thread_id), ttl_ms=leases.ttl_ms, wait_ms=leases.wait_ms,
                                    outlast_ms=leases.ttl_ms)
        heartbeat = asyncio.create_task(keep_alive(leases.pool, lease, interval_ms=leases.heartbeat_ms))
        try:
            async for part in super().astream(input, lease.configure(config or {}), **kwargs):
                yield part
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            await asyncio.shield(_let_go(leases.pool, lease))


async def _let_go(pool, lease: ThreadLease) -> None:
    """Release ``lease``, trying :data:`RELEASE_ATTEMPTS` times; a lease that cannot be released (the
    database is gone) is logged and expires on its own within its TTL."""
    for attempt in range(1, RELEASE_ATTEMPTS + 1):
        try:
            await release_lease(pool, lease)
            return
        except Exception as exc:  # noqa: BLE001 (the run's own outcome is what the caller sees)
            if attempt == RELEASE_ATTEMPTS:
                log.warning("could not release the lease of thread %r (it expires within %d ms): %s",
                            lease.thread_id, lease.ttl_ms, exc)
