"""C38: events lost on a kill or a failed flush.

(a) A process commits a batch of 3 calls through the tools node and is killed (SIGKILL) before its
event buffer is flushed; the thread is resumed. The 3 ``applied`` events must be in the events table
afterwards: the ledger rows committed with the calls, and a flush rebuilds the missing events from them.
(b) A flush that fails (the table unreachable, every connection of the pool killed) keeps its rows
and the next flush writes them; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap

from agentlab.core.events import RECOVERED_DETAIL
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome
from conftest import fetch, scalar

THREAD = "c38-killed"
CALLS = [
    {"name": "ApplyCredit", "args": {"customer_id": 1, "amount_cents": 100}, "id": "call-1", "type": "tool_call"},
    {"name": "CreateCreditMemo", "args": {"customer_id": 1, "reference": "C38-1", "amount_cents": 200},
     "id": "call-2", "type": "tool_call"},
    {"name": "CreateInvoice", "args": {"customer_id": 1, "billing_period": "2026-05-01", "amount_cents": 300},
     "id": "call-3", "type": "tool_call"},
]
CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from agentlab.core.safeguards import preset
    from agentlab.runtime.harness import Harness

    async def main(url, calls):
        h = await Harness.open(url)
        batch = await h.node(preset("full")).run_batch(calls, thread_id="{thread}", tenant_id="acme")
        print(",".join(r.outcome.value for r in batch.results), h.events.pending, flush=True)
        await asyncio.sleep(60)  # killed here, before any flush

    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
""").format(thread=THREAD)
CALL_EVENTS = "SELECT tool_call_id, outcome, detail FROM events WHERE thread_id = %s AND kind = 'call' ORDER BY id"


async def test_c38_applied_events_of_a_killed_process_are_recovered_from_the_ledger(harness, database_url):
    import json

    child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, database_url, json.dumps(CALLS),
                                                 stdout=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().split()
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert line == ["applied,applied,applied", "3"]  # committed; 3 events still in the dead process's buffer
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (THREAD,)) == 3
    assert await fetch(harness, CALL_EVENTS, (THREAD,)) == []  # lost with the process

    resumed = await harness.node(preset("full")).run_batch(CALLS, thread_id=THREAD, tenant_id="acme")
    assert [r.outcome for r in resumed.results] == [Outcome.REPLAYED] * 3
    assert await harness.events.flush() == 6
    events = await fetch(harness, CALL_EVENTS, (THREAD,))
    assert sorted((c, o) for c, o, _ in events) == sorted(
        [(f"call-{i}", "replayed") for i in (1, 2, 3)] + [(f"call-{i}", "applied") for i in (1, 2, 3)])
    assert {d for _, o, d in events if o == "applied"} == {RECOVERED_DETAIL}
    assert harness.events.recovered == 3
    assert await harness.events.recover() == 0  # recovered once, never twice

    # a batch whose events were flushed normally gets no recovered duplicate
    ok = await harness.node(preset("full")).run_batch(
        [{**c, "id": f"ok-{c['id']}", "args": {**c["args"], "reference": "C38-2"} if "reference" in c["args"]
          else {**c["args"], "billing_period": "2026-06-01"} if "billing_period" in c["args"] else c["args"]}
         for c in CALLS], thread_id="c38-normal", tenant_id="acme")
    assert [r.outcome for r in ok.results] == [Outcome.APPLIED] * 3
    assert await harness.events.flush() == 3
    assert [o for _, o, d in await fetch(harness, CALL_EVENTS, ("c38-normal",))] == ["applied"] * 3
    assert await scalar(harness, "SELECT count(*) FROM events WHERE detail = %s", (RECOVERED_DETAIL,)) == 3


async def test_c38_a_failed_flush_keeps_its_events_and_the_next_flush_writes_them(harness):
    node = harness.node(preset("full"))
    await node.run_batch(CALLS[:1], thread_id="c38-flush", tenant_id="acme")
    assert harness.events.pending == 1
    async with harness.pool.connection() as conn:
        await conn.execute("ALTER TABLE events RENAME TO events_away")
    try:
        assert await harness.events.flush() == 0
    finally:
        async with harness.pool.connection() as conn:
            await conn.execute("ALTER TABLE events_away RENAME TO events")
    assert (harness.events.pending, harness.events.failed_flushes, harness.events.dropped) == (1, 1, 0)

    # every connection of the pool is killed, as by a server restart: kept again until a flush gets through
    await node.run_batch(CALLS[1:2], thread_id="c38-flush", tenant_id="acme")
    async with harness.pool.connection() as conn:
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    written = 0
    for _ in range(harness.pool.max_size + 1):
        written += await harness.events.flush()
        if not harness.events.pending:
            break
    assert written == 2 and harness.events.dropped == 0
    assert [(c, o) for c, o, _ in await fetch(harness, CALL_EVENTS, ("c38-flush",))] == [
        ("call-1", "applied"), ("call-2", "applied")]
