"""The yardstick's wire lets a blocked statement's siblings go after ``order_wait_s`` of the event loop's own
time: a loop that was not scheduled (a loaded machine, CI running notebooks beside the suite) does not use
up that wait, so the order of events, hence notebook 19's table, is the same however busy the machine."""

from __future__ import annotations

import asyncio
import time

from agentlab.lab.wire import _wait_unstalled


async def test_a_stalled_loop_does_not_use_up_the_order_wait():
    loop = asyncio.get_running_loop()
    never = loop.create_future()
    loop.call_later(0.01, time.sleep, 0.3)  # the process is not scheduled for 0.3 s
    t0 = loop.time()
    await _wait_unstalled([never], 0.1)
    waited = loop.time() - t0
    assert waited >= 0.3 + 0.1 - 0.02 - 0.005  # the stall is not charged (one slice of it is, at most)


async def test_a_finished_statement_ends_the_wait_at_once():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon(done.set_result, None)
    t0 = loop.time()
    await _wait_unstalled([done], 10.0)
    assert loop.time() - t0 < 1.0 and done.done()


async def test_an_idle_loop_waits_about_the_order_wait():
    loop = asyncio.get_running_loop()
    never = loop.create_future()
    t0 = loop.time()
    await _wait_unstalled([never], 0.1)
    assert loop.time() - t0 >= 0.1
