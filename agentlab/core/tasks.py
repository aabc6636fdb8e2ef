"""Loops that run beside other work until cancelled, and stop even when a library lost the cancellation.

The lease's heartbeat (:func:`agentlab.core.run_lock.keep_alive`) and the server's watchdog
(:meth:`agentlab.runtime.watch.ServerWatch.watch_server`) run as tasks beside a run; the run ends them with
``task.cancel()`` and waits for them. On Python 3.11, ``asyncio.wait_for`` loses a cancellation that arrives
as the future it waits on completes (cpython gh-86296, fixed in 3.12), and psycopg_pool waits for a free
connection through it. A heartbeat cancelled at the moment the pool hands it a connection then carries on:
it renews the lease, sleeps, renews again, and the run waiting for it to end waits for ever (seen: an
experiment's episode, on a pool kept busy by 16 episodes at once, hung after its last answer).

The task remembers that it was cancelled (``Task.cancelling()`` stays above 0), so a loop that pauses with
:func:`pause` instead of ``asyncio.sleep`` raises the lost cancellation at its next pause and ends.
"""

from __future__ import annotations

import asyncio


def cancel_requested() -> bool:
    """True when the running task's cancellation was requested and has not been withdrawn
    (``Task.cancelling()``), even if the ``CancelledError`` never reached this code; False outside a task."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def pause(delay_s: float) -> None:
    """``asyncio.sleep(delay_s)`` (seconds) for a loop that runs until its task is cancelled.

    Raises:
        asyncio.CancelledError: at once, when this task was cancelled earlier and the cancellation was lost on
            the way (:func:`cancel_requested`); or when it is cancelled during the pause.
    """
    if cancel_requested():
        raise asyncio.CancelledError
    await asyncio.sleep(delay_s)
