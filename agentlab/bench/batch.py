"""The tools node's batch against plain psycopg sending the same SQL, and a way to see that SQL.

The batch is the refund story's three calls (``CreateCreditMemo``, ``ApplyCredit``, ``QueueRefund``)
under the ``full`` preset, on one customer of the bench's own database. :func:`plain_batch` is that
batch written out by hand: the statements :class:`agentlab.core.batch.TransactionalToolsNode` sends, in the
same order, with the same savepoint names, on a connection from the same pool, and nothing else
(no validation, no events, no ToolMessages). :func:`traced_statements` records what a batch really
sent (libpq's protocol trace), so the bench and its test can check that both send the same SQL.

The node's events are logged, not stored, while it is timed (``EventLog(None)``): the event rows are
the event log's writes, outside the batch, and would otherwise be SQL the plain version does not send.

Sources: PostgreSQL docs "Frontend/Backend Protocol: Message Flow" (a simple ``Query`` and an extended
query ended by ``Sync`` are one round trip each); libpq "Control Functions" (``PQtrace``); psycopg
"Transactions management".
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import tempfile
from dataclasses import dataclass

from psycopg import pq

from agentlab.core.agent_role import AGENT_ROLE
from agentlab.core.batch import (
    BIND_THREAD_TENANT,
    LEDGER_INSERT,
    LEDGER_LOOKUP_WITH_ARGS,
    RELEASE_SAVEPOINT,
    SAVEPOINT,
    TransactionalToolsNode,
    idempotency_key,
)
from agentlab.core.outbox import INSERT_OUTBOX, REFUND_TOPIC
from agentlab.domains.billing.tools import APPLY_CREDIT, CREATE_CREDIT_MEMO, CREATE_REFUND

BATCH_TENANT = "acme"
OPENING_CREDIT_CENTS = 10**9 // 2  # the bench deducts one cent per batch
INSERT_BENCH_CUSTOMER = "INSERT INTO customers (tenant_id, name, credit_cents) VALUES (%s, %s, %s) RETURNING id"

# The statements the node sends for the refund batch under ``full``, all pipelined (extended queries): BEGIN,
# the prelude, the thread's tenant and the ledger look-up in one round trip; then the three calls in one
# pipeline: per call SAVEPOINT with the tool's first statement (one round trip, carrying the previous call's
# ledger row and RELEASE), each further statement whose result the tool reads (one more), and the last call's
# ledger row, RELEASE and COMMIT in the pipeline's Sync (one more).
BEGIN = "BEGIN"
PRELUDE = ("SELECT set_config('role', %s, true), set_config('agentlab.tenant_id', %s, true), "
           "set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true), "
           "pg_advisory_xact_lock(hashtextextended(%s, 0))")
RELEASE = RELEASE_SAVEPOINT
COMMIT = "COMMIT"
NODE_ROUND_TRIPS = 6  # 1 to open, 1 + 1 + 2 for the calls (QueueRefund reads two statements' results), 1 to commit
NAIVE_ROUND_TRIPS = 18  # BEGIN, prelude, tenant, look-up; SAVEPOINT, each statement, ledger row, RELEASE per call; COMMIT

_TRACE_MESSAGE = re.compile(r"^([FB])\t\d+\t(\w+)(?:\t ?(.*))?$", re.S)
_PARSE_BODY = re.compile(r'^"[^"]*" "(.*)" \d+(?: \w+)*$', re.S)


@dataclass(frozen=True)
class BatchCalls:
    """One refund batch: its tool calls (fresh ids) and the values the plain version sends."""

    thread_id: str
    customer_id: int
    reference: str
    call_ids: tuple[str, str, str]

    @property
    def tool_calls(self) -> list[dict]:
        """The batch as an ``AIMessage.tool_calls`` list."""
        memo, credit, refund = self.args
        return [{"name": name, "args": args, "id": cid, "type": "tool_call"}
                for name, args, cid in zip(("CreateCreditMemo", "ApplyCredit", "QueueRefund"),
                                           (memo, credit, refund), self.call_ids)]

    @property
    def args(self) -> tuple[dict, dict, dict]:
        c = self.customer_id
        return ({"customer_id": c, "reference": self.reference, "amount_cents": 1, "reason": "bench", "invoice_id": None},
                {"customer_id": c, "amount_cents": 1},
                {"customer_id": c, "reference": self.reference, "amount_cents": 1})


class BatchSource:
    """Fresh batches on one customer: every call id and reference is new, so every batch applies."""

    def __init__(self, customer_id: int, thread_id: str = "bench-batch"):
        self.customer_id = customer_id
        self.thread_id = thread_id
        self._n = itertools.count(1)

    def next(self) -> BatchCalls:
        n = next(self._n)
        return BatchCalls(self.thread_id, self.customer_id, f"BENCH-{n}",
                          (f"call_{n}_memo", f"call_{n}_credit", f"call_{n}_refund"))


async def create_bench_customer(pool) -> int:
    """A customer of :data:`BATCH_TENANT` with enough credit for every batch the bench runs; its id."""
    async with pool.connection() as conn:
        cur = await conn.execute(INSERT_BENCH_CUSTOMER, (BATCH_TENANT, "Bench Customer", OPENING_CREDIT_CENTS))
        return (await cur.fetchone())[0]


async def node_batch(node: TransactionalToolsNode, batch: BatchCalls) -> None:
    """One batch through the node (validation, savepoints, ledger, outbox, results); raises if not applied."""
    result = await node.run_batch(batch.tool_calls, thread_id=batch.thread_id, tenant_id=BATCH_TENANT)
    if result.rolled_back or any(r.outcome.value != "applied" for r in result.results):
        raise RuntimeError(f"bench batch not applied: {[r.content for r in result.results]}")


async def _three_calls(conn, batch: BatchCalls, keys: list[str], call) -> None:
    """The batch's three tool calls and their ledger rows, each inside ``call(conn, last=...)``: the async
    context manager that makes one call a savepoint (pipelined by hand, or a nested ``conn.transaction()``)."""
    thread, c = batch.thread_id, batch.customer_id
    memo_args, credit_args, refund_args = batch.args
    async with call(conn, last=False):
        memo_id = (await (await conn.execute(CREATE_CREDIT_MEMO, (batch.reference, 1, "bench", c))).fetchone())[0]
        memo = {"credit_memo_id": memo_id, "reference": batch.reference, "amount_cents": 1}
        await conn.execute(LEDGER_INSERT, (keys[0], BATCH_TENANT, thread, batch.call_ids[0], 0, "CreateCreditMemo",
                                           json.dumps(memo_args), json.dumps(memo), 1))
    async with call(conn, last=False):
        left = (await (await conn.execute(APPLY_CREDIT, (1, c))).fetchone())[0]
        credit = {"customer_id": c, "applied_cents": 1, "remaining_credit_cents": left}
        await conn.execute(LEDGER_INSERT, (keys[1], BATCH_TENANT, thread, batch.call_ids[1], 0, "ApplyCredit",
                                           json.dumps(credit_args), json.dumps(credit), 1))
    async with call(conn, last=True):
        refund_id = (await (await conn.execute(CREATE_REFUND, (batch.reference, 1, c))).fetchone())[0]
        dedupe = f"refund:{c}:{batch.reference}"
        payload = {"customer_id": c, "refund_id": refund_id, "amount_cents": 1, "reference": batch.reference}
        queued = await (await conn.execute(INSERT_OUTBOX, (REFUND_TOPIC, json.dumps(payload), dedupe,
                                                           thread))).fetchone()
        refund = {"refund_id": refund_id, "amount_cents": 1, "status": "queued" if queued else "already_queued"}
        await conn.execute(LEDGER_INSERT, (keys[2], BATCH_TENANT, thread, batch.call_ids[2], 0, "QueueRefund",
                                           json.dumps(refund_args), json.dumps(refund), 1))


@contextlib.asynccontextmanager
async def _pipelined_call(conn, *, last: bool):
    """One call as the node sends it, inside the batch's one pipeline: SAVEPOINT goes with the call's first
    statement, the ledger row and RELEASE with the next call's, and after the ``last`` call with COMMIT in
    the pipeline's closing Sync."""
    await conn.execute(SAVEPOINT)
    yield
    await conn.execute(RELEASE)
    if last:
        await conn.execute(COMMIT)


def _nested_transaction(conn, *, last: bool):
    """One call as psycopg's documentation nests it: a ``conn.transaction()`` (a savepoint) inside the batch's."""
    return conn.transaction()


async def plain_batch(pool, batch: BatchCalls, *, statement_timeout_ms: int = 2000, lock_timeout_ms: int = 300) -> None:
    """The same batch in plain psycopg: exactly the statements the node sends, pipelined as it pipelines them."""
    thread = batch.thread_id
    keys = [idempotency_key(thread, cid, tenant_id=BATCH_TENANT) for cid in batch.call_ids]
    async with pool.connection() as conn:
        try:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(PRELUDE, (AGENT_ROLE, BATCH_TENANT, f"{statement_timeout_ms}ms",
                                             f"{lock_timeout_ms}ms", thread))
                bind = await conn.execute(BIND_THREAD_TENANT, {"thread": thread, "tenant": BATCH_TENANT})
                lookup = await conn.execute(LEDGER_LOOKUP_WITH_ARGS, (keys,))
            await bind.fetchall()
            await lookup.fetchall()
            async with conn.pipeline():  # its Sync carries the last call's ledger row, RELEASE and COMMIT
                await _three_calls(conn, batch, keys, _pipelined_call)
        except BaseException:
            if not conn.closed:
                await conn.execute("ROLLBACK")
            raise


async def naive_batch(pool, batch: BatchCalls, *, statement_timeout_ms: int = 2000, lock_timeout_ms: int = 300) -> None:
    """The same statements written the way psycopg's documentation nests transactions: an outer
    ``conn.transaction()`` and one nested ``conn.transaction()`` (a savepoint) per call, every statement
    waiting for its answer (:data:`NAIVE_ROUND_TRIPS` round trips, against the node's :data:`NODE_ROUND_TRIPS`)."""
    thread = batch.thread_id
    keys = [idempotency_key(thread, cid, tenant_id=BATCH_TENANT) for cid in batch.call_ids]
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(PRELUDE, (AGENT_ROLE, BATCH_TENANT, f"{statement_timeout_ms}ms", f"{lock_timeout_ms}ms",
                                     thread))
        await (await conn.execute(BIND_THREAD_TENANT, {"thread": thread, "tenant": BATCH_TENANT})).fetchall()
        await (await conn.execute(LEDGER_LOOKUP_WITH_ARGS, (keys,))).fetchall()
        await _three_calls(conn, batch, keys, _nested_transaction)


# --------------------------------------------------------------------------- what was sent


class _OneConnection:
    """A pool stand-in that hands out one connection (so a trace sees everything a batch sends)."""

    def __init__(self, conn):
        self.conn = conn

    @contextlib.asynccontextmanager
    async def connection(self, *args, **kwargs):
        yield self.conn


@dataclass(frozen=True)
class Sent:
    """What one batch sent: the statements in order, and the round trips they took."""

    statements: tuple[str, ...]
    round_trips: int


def parse_trace(text: str) -> Sent:
    """The statements and round trips in a libpq trace (``PQTRACE_REGRESS_MODE``): each simple ``Query``,
    each ``Sync`` and each ``Flush`` (psycopg's flush request when a pipelined statement's result is read)
    ends one round trip, but a ``Flush`` right after a ``Sync`` asks for nothing new (psycopg sends one
    when it leaves a pipeline): the same wait. An extended query's text is in its ``Parse`` message (a
    statement prepared earlier on the connection has none: trace fresh connections)."""
    statements, trips, last = [], 0, None
    for raw in re.split(r"\n(?=[FB]\t\d+\t)", text.strip()):
        m = _TRACE_MESSAGE.match(raw)
        if m is None or m.group(1) != "F":
            continue
        kind, body = m.group(2), m.group(3) or ""
        last, previous = kind, last
        if kind == "Query":
            statements.append(body[1:-1])
            trips += 1
        elif kind == "Parse":
            p = _PARSE_BODY.match(body)
            statements.append(p.group(1) if p else body)
        elif kind == "Sync" or (kind == "Flush" and previous != "Sync"):
            trips += 1
    return Sent(tuple(statements), trips)


async def traced_statements(url: str, run) -> Sent:
    """Run ``await run(pool)`` with a one-connection pool on a fresh connection to ``url``; return what it sent."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        with tempfile.TemporaryFile("w+") as f:
            conn.pgconn.trace(f.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                await run(_OneConnection(conn))
            finally:
                conn.pgconn.untrace()
            f.seek(0)
            return parse_trace(f.read())
