"""A loop run beside a run (the lease's heartbeat) ends when cancelled, even when the cancellation is lost on the way.

On Python 3.11, psycopg_pool waits for a free connection through ``asyncio.wait_for``, which loses a
cancellation that arrives as the connection is handed over (cpython gh-86296). The heartbeat then carried on
renewing its lease for ever, and the run waiting for it to end waited for ever: an experiment's episode, on
a pool kept busy by 16 episodes at once, hung after its last answer. The race is forced here, not hoped for:
the pool has one connection, the test holds it while the heartbeat waits for it, then puts it back and
cancels the heartbeat in the same step.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from psycopg_pool import AsyncConnectionPool

from agentlab.core.run_lock import acquire_lease, keep_alive
from agentlab.core.tasks import cancel_requested, pause
from conftest import scalar

BOUND_S = 10.0  # far above the heartbeat's interval (50 ms here), far below a hang
LOST_ON_THIS_PYTHON = sys.version_info < (3, 12)  # 3.12's wait_for no longer loses it


async def cancel_as_the_pool_hands_over(pool: AsyncConnectionPool, make_task) -> asyncio.Task:
    """Start ``make_task()`` while the test holds ``pool``'s one connection; once the task waits for it, put it
    back and cancel the task at once. Returns the task."""
    held = await pool.getconn()
    task = make_task()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    while pool.get_stats().get("requests_waiting", 0) == 0:  # until the task waits for the connection
        assert loop.time() < deadline and not task.done(), "the task never asked the pool for a connection"
        await asyncio.sleep(0.01)
    await pool.putconn(held)  # handed to the waiting task...
    task.cancel()  # ...and cancelled before it could run: 3.11's wait_for returns the connection instead
    return task


async def test_a_heartbeat_cancelled_as_the_pool_hands_it_a_connection_ends_at_its_next_pause(harness):
    lease = await acquire_lease(harness.pool, "thread-lost-cancel", ttl_ms=60_000)
    renewed_before = await scalar(harness, "SELECT expires_at FROM runs.thread_leases WHERE thread_id = %s",
                                  (lease.thread_id,))
    async with AsyncConnectionPool(harness.url, min_size=1, max_size=1, open=False) as pool:
        await pool.open(wait=True)
        task = await cancel_as_the_pool_hands_over(
            pool, lambda: asyncio.create_task(keep_alive(pool, lease, interval_ms=50)))
        done, _ = await asyncio.wait({task}, timeout=BOUND_S)
        assert done, "the heartbeat still runs after its cancellation"
        assert task.cancelled()
    renewed_after = await scalar(harness, "SELECT expires_at FROM runs.thread_leases WHERE thread_id = %s",
                                 (lease.thread_id,))
    if LOST_ON_THIS_PYTHON:  # the race happened: the renewal the pool let through ran after the cancel
        assert renewed_after > renewed_before


@pytest.mark.skipif(not LOST_ON_THIS_PYTHON, reason="Python 3.12's asyncio.wait_for no longer loses a cancellation")
async def test_the_same_loop_on_asyncio_sleep_runs_on_after_the_lost_cancellation(harness):
    """Why :func:`pause`: the heartbeat's loop with ``asyncio.sleep`` survives the same race (then is ended by a
    second cancellation, which reaches it at its sleep)."""
    renewals, twice = 0, asyncio.Event()

    async def plain_loop(pool):
        nonlocal renewals
        while True:
            await asyncio.sleep(0.05)
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
            renewals += 1
            if renewals == 2:
                twice.set()

    async with AsyncConnectionPool(harness.url, min_size=1, max_size=1, open=False) as pool:
        await pool.open(wait=True)
        task = await cancel_as_the_pool_hands_over(pool, lambda: asyncio.create_task(plain_loop(pool)))
        await asyncio.wait_for(twice.wait(), BOUND_S)  # a renewal after the cancel, then a full round more
        assert not task.done() and task.cancelling() == 1
        task.cancel()
        await asyncio.wait({task}, timeout=BOUND_S)
        assert task.cancelled()


async def test_pause_raises_at_once_in_a_task_whose_cancellation_was_swallowed():
    """Any swallower, not only the pool's: a task that catches its own CancelledError and goes on ends at
    its next :func:`pause`, which does not sleep first."""
    reached = asyncio.Event()

    async def swallower():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # lost, as a library may lose it
        assert cancel_requested()
        reached.set()
        await pause(3600)

    task = asyncio.create_task(swallower())
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=BOUND_S)
    assert done and reached.is_set() and task.cancelled()
    assert not cancel_requested()  # the test's own task was never cancelled


async def test_a_run_waiting_for_a_busy_thread_ends_on_the_lost_cancellation_and_takes_no_lease(harness):
    """The waiting side of the lease: a run polling for a busy thread, cancelled as the pool hands it a
    connection, ends cancelled at its next poll instead of polling on (and perhaps taking the lease for a caller
    that has gone) until its ``wait_ms``."""
    holder = await acquire_lease(harness.pool, "thread-busy", ttl_ms=60_000)
    async with AsyncConnectionPool(harness.url, min_size=1, max_size=1, open=False) as pool:
        await pool.open(wait=True)
        task = await cancel_as_the_pool_hands_over(
            pool, lambda: asyncio.create_task(acquire_lease(pool, "thread-busy", wait_ms=60_000)))
        done, _ = await asyncio.wait({task}, timeout=BOUND_S)
        assert done and task.cancelled()
    owners = await scalar(harness, "SELECT array_agg(owner_token) FROM runs.thread_leases WHERE thread_id = %s",
                          ("thread-busy",))
    assert owners == [holder.owner_token]
