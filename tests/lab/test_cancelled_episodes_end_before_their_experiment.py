"""An experiment that cancels its episodes (a server gone, Ctrl-C) waits for every one of them to end, even when
it is cancelled itself while doing so: the server watchdog cancels the experiment while it is already cancelling
its episodes after one of them saw the server go first. An episode that outlived its experiment found its pool
closed and its error was logged as "unhandled exception during asyncio.run() shutdown" with 78 lines of
traceback, where the command line promises one line (tests/test_chaos_interrupts.py)."""

from __future__ import annotations

import asyncio

import pytest

from agentlab.lab.experiments import _cancel


def episode(started: asyncio.Event, cleaned_up: asyncio.Event, release: asyncio.Event, raises: bool):
    async def run() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # an episode in flight
        except asyncio.CancelledError:
            await release.wait()  # its clean-up waits (a connection to a server that is gone)
            cleaned_up.set()
            if raises:
                raise RuntimeError("the pool is closed") from None
            raise
    return run()


async def test_an_experiment_cancelled_while_cancelling_its_episodes_waits_for_them_all():
    started = [asyncio.Event() for _ in range(3)]
    cleaned = [asyncio.Event() for _ in range(3)]
    release = asyncio.Event()
    tasks = [asyncio.create_task(episode(s, c, release, raises=i == 1)) for i, (s, c) in enumerate(zip(started,
                                                                                                      cleaned))]
    for s in started:
        await s.wait()
    stopping = asyncio.create_task(_cancel(tasks, grace_s=3600))
    while not all(t.cancelling() for t in tasks):
        await asyncio.sleep(0)
    stopping.cancel()  # the watchdog cancels the experiment meanwhile
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done()  # still waiting for its episodes' clean-up
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert all(c.is_set() for c in cleaned) and all(t.done() for t in tasks)
    assert [type(t.exception()).__name__ if not t.cancelled() else "cancelled" for t in tasks] == [
        "cancelled", "RuntimeError", "cancelled"]


async def test_an_episode_that_ignores_its_first_cancellation_is_cancelled_again_after_the_grace():
    loop = asyncio.get_running_loop()
    first_cancel = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            first_cancel.set()
        await asyncio.Event().wait()  # swallowed the first one: waits on, until cancelled again

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    t0 = loop.time()
    await _cancel([task], grace_s=0.05)
    assert first_cancel.is_set() and task.cancelled()
    assert loop.time() - t0 >= 0.05


async def test_an_uncancelled_cleanup_returns_without_raising():
    async def quick() -> None:
        await asyncio.Event().wait()

    tasks = [asyncio.create_task(quick()) for _ in range(2)]
    await asyncio.sleep(0)
    await _cancel(tasks)
    assert all(t.cancelled() for t in tasks)


async def test_an_episode_beyond_cancellation_is_ended_by_releasing_what_it_waits_on():
    # a shielded write waiting for a pooled connection: no cancel reaches it; closing the pool does
    pool_closed = asyncio.Event()

    async def shielded_write() -> None:
        await pool_closed.wait()
        raise RuntimeError("the pool is closed")

    async def stuck() -> None:  # waits its write out, however often it is cancelled, then ends cancelled
        cancelled = False
        while not inner.done():
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                cancelled = True
            except RuntimeError:
                break
        if cancelled:
            raise asyncio.CancelledError

    inner = asyncio.ensure_future(shielded_write())
    task = asyncio.create_task(stuck())
    await asyncio.sleep(0)
    released = []

    async def release() -> None:
        released.append(task.done())
        pool_closed.set()

    await _cancel([task], grace_s=0.01, release=release)
    await asyncio.wait([inner])
    assert released == [False] and task.cancelled()
    assert isinstance(inner.exception(), RuntimeError)
