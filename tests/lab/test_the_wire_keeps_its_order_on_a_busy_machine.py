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


class _Provider:
    """The provider's side of the network in these tests: records each payment; the first one answers with
    a timeout after doing the work (notebook 19's ``provider_timeout``)."""

    def __init__(self):
        self.charged: list[str] = []

    async def create_charge(self, customer: str) -> dict:
        self.charged.append(customer)
        if len(self.charged) == 1:
            raise TimeoutError("payment provider did not answer in time")
        return {"customer": customer}


async def _batch_of_two_charges(statement_s: float) -> list[str]:
    """Two sibling calls in one agent process: each reads its invoice through the process's wire (the second
    one's read takes ``statement_s`` on the server), then charges; the first failure cancels the other, as
    LangGraph cancels a super-step's other tasks. Returns the customers the provider charged."""
    from agentlab.lab.wire import NetworkProvider, Wire

    db = Wire()
    provider = _Provider()
    network = NetworkProvider(provider)
    network.process_wire = db

    async def call(customer: str, read_s: float) -> dict:
        await db.carry(lambda: asyncio.sleep(read_s))
        return await network.create_charge(customer)

    tasks = [asyncio.create_task(call("first", 0.0)), asyncio.create_task(call("second", statement_s))]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return provider.charged


async def test_a_provider_error_waits_for_a_sibling_still_reading_its_invoice():
    # the sibling's read outlasts the wire's order wait (0.25 s), so the first call's read is answered
    # without it; its provider answer (0.05 s travel, 0.02 s back) is due while the sibling still reads:
    # the answer waits for the read, then for the sibling's request, so both calls charged
    assert await _batch_of_two_charges(statement_s=0.4) == ["first", "second"]


async def test_a_provider_error_waits_for_a_sibling_request_on_its_way():
    # the sibling's read ends before the first provider answer is due, its request still travels then
    assert await _batch_of_two_charges(statement_s=0.3) == ["first", "second"]
