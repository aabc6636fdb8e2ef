"""The transactional outbox, both halves: the intent recorded in the batch, and the worker that sends it.

A tool never calls the provider; it inserts an ``outbox`` row in the batch's transaction
(:func:`enqueue`, :func:`send_payment`), so the intent exists if and only if the batch committed.
The worker then, per round, takes up to ``batch_size`` rows, each in a transaction of its own (so a
row's failure never rolls back the marks of the rows paid before it):

1. claims one due row with ``FOR UPDATE SKIP LOCKED`` (several workers never take the same row);
2. asks the provider whether a payment with the row's dedupe key as reference already exists
   (a provider forgets idempotency keys after its retention: this look-up is what still holds then);
3. otherwise calls the provider with the row's dedupe key as idempotency key and the row's payload
   as the body, identical on every retry; no key is ever minted here;
4. marks the row ``dispatched``; on a timeout counts the attempt and backs off (capped,
   exponential); after ``max_attempts``, or at once on "same key, other parameters", a request the
   provider refuses as such (HTTP 400: it will refuse it again), a topic it
   does not know or a payload it cannot read (a poison row: a missing ``amount_cents``), parks the
   row as ``dead_letter`` with the reason in ``last_error``. Any other error of a dispatch counts
   as a failed attempt of that row alone; the rows after it are still dispatched.

A second intent under a dedupe key already queued (the natural key: an invoice's period, a refund's
reference) is answered ``already_queued`` only when it is the same payment (topic, customer, amount);
another one is refused ``FAILED [conflict]`` naming the queued one (:func:`send_payment`, case C50).

Topics: ``payment.charge`` and ``payment.refund`` go to the payment provider; ``notify.email`` goes
to the notification sink (:mod:`agentlab.sim.notifier`), which has no idempotency keys at all, so the
look-up by reference in step 2 is the only thing that keeps a message to one delivery. Messages to
people keep their order per thread: a ``notify.email`` row is not claimed while an earlier one of the
same thread is pending (backing off after a timeout, say), so a saga's correction never reaches the
customer before the notice it corrects. A row parked as ``dead_letter`` no longer holds the later ones.

Sources: PostgreSQL "SELECT ... FOR UPDATE SKIP LOCKED" (SQL Commands, SELECT, The Locking Clause);
Stripe "Idempotent requests".
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from agentlab.core.errors import (
    Category,
    IdempotencyConflict,
    ProviderError,
    ProviderRejected,
    ToolError,
    is_infrastructure,
)
from agentlab.core.hooks import Hook, run_hooks
from agentlab.core.messages import ALREADY_QUEUED_OTHERWISE
from agentlab.core.storable import storable_text

if TYPE_CHECKING:
    from agentlab.core.toolspec import ToolContext

log = logging.getLogger(__name__)

CHARGE_TOPIC = "payment.charge"
REFUND_TOPIC = "payment.refund"
NOTIFY_TOPIC = "notify.email"


MAX_PAYMENT_CENTS = 99_999_999
"""The largest payment the provider takes, in cents (Stripe's maximum for USD: $999,999.99); a larger one is
refused (:class:`agentlab.core.errors.ProviderRejected`), so a domain's payment tools refuse it first."""


def customer_ref(customer_id: int) -> str:
    """The payment provider's name for one of our customers (``cus_<id>``): how a payment intent's
    customer is known at the provider, and how a checker finds that customer's payments there."""
    return f"cus_{customer_id}"


INSERT_OUTBOX = """
INSERT INTO public.outbox (topic, payload, dedupe_key, thread_id) VALUES (%s, %s, %s, %s)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id
"""

# A message to a person waits while an earlier message of the same thread (a saga run's, an agent
# thread's) is still pending: a correction never overtakes the notice it corrects (C37).
IN_ORDER = f"""NOT (o.topic = '{NOTIFY_TOPIC}' AND o.thread_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM outbox e WHERE e.status = 'pending' AND e.topic = '{NOTIFY_TOPIC}'
                           AND e.thread_id = o.thread_id AND e.id < o.id))"""
CLAIM_ONE = f"""
SELECT id, topic, payload, dedupe_key, attempts FROM outbox o
WHERE status = 'pending' AND available_at <= now() AND (%(thread)s::text IS NULL OR thread_id = %(thread)s)
  AND {IN_ORDER} AND id <> ALL(%(seen)s)
ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
"""
MARK_DISPATCHED = """
UPDATE outbox SET status = 'dispatched', dispatched_at = now(), attempts = attempts + 1,
                  provider_ref = %s, last_error = NULL
WHERE id = %s
"""
MARK_RETRY = """
UPDATE outbox SET attempts = attempts + 1, last_error = %s,
                  available_at = now() + make_interval(secs => %s)
WHERE id = %s
"""
MARK_DEAD = "UPDATE outbox SET status = 'dead_letter', attempts = attempts + 1, last_error = %s WHERE id = %s"
NEXT_DUE = f"""
SELECT min(available_at) - now() FROM outbox o
WHERE status = 'pending' AND (%(thread)s::text IS NULL OR thread_id = %(thread)s) AND {IN_ORDER}
"""
# What the payment queued under a dedupe key asks for (topic, then PAYMENT_FIELDS): read from the table
# by its owner, and through public.queued_payment (its thread's tenant only) by the agent role, which
# may not read payloads.
QUEUED_UNDER_KEY = """
SELECT topic, payload -> 'customer_id', payload -> 'amount_cents' FROM public.outbox WHERE dedupe_key = %s
"""
QUEUED_FOR_TENANT = "SELECT topic, customer_id, amount_cents FROM public.queued_payment(%s)"
COUNT_BY_STATUS = "SELECT status, count(*) FROM outbox GROUP BY status"
COUNT_BY_STATUS_OF_THREAD = "SELECT status, count(*) FROM outbox WHERE thread_id = %s GROUP BY status"


# --------------------------------------------------------------------------- the intent, in the batch


async def enqueue(conn, topic: str, payload: dict, dedupe_key: str, thread_id: str | None) -> bool:
    """Record an intent on ``conn`` (inside the caller's transaction). Returns False when a row with
    this dedupe key was already queued (``ON CONFLICT DO NOTHING``): the intent is then not doubled."""
    cur = await conn.execute(INSERT_OUTBOX, (topic, json.dumps(payload), dedupe_key, thread_id))
    return await cur.fetchone() is not None


# What the worker asks the provider for, besides the topic and the key: a payment's identity. Two intents
# under one natural key are the same payment when these agree (the provider's own idempotency check
# compares the same request: "same key, other parameters" is its IdempotencyConflict).
PAYMENT_FIELDS = ("customer_id", "amount_cents")
_PAYMENT_KIND = {CHARGE_TOPIC: "charge", REFUND_TOPIC: "refund"}


async def send_payment(conn, ctx: ToolContext, topic: str, key: str, payload: dict, result: dict) -> dict:
    """Record the payment intent in the outbox (same transaction), or, without the outbox, call the
    provider inline as a first draft does: mid-transaction, with no idempotency key.

    ``payload`` holds ``customer_id`` and ``amount_cents``; ``result`` is the tool's result, to which
    ``status`` (``queued``, ``already_queued`` or ``sent``) and, inline, ``payment_id`` are added.
    ``already_queued`` answers only the same payment (:data:`PAYMENT_FIELDS` and the topic agree with
    the row queued under ``key``, the natural key); another one under that key is refused.

    Raises:
        ToolError: (conflict) a different payment is already queued under ``key``; the message names it.
        RuntimeError: the outbox is off and ``ctx`` carries no provider.
    """
    if ctx.safeguards.outbox:
        if await enqueue(conn, topic, payload, key, ctx.thread_id):
            return {**result, "status": "queued"}
        await _refuse_another_payment(conn, ctx, topic, key, payload)
        return {**result, "status": "already_queued"}
    if ctx.provider is None:
        raise RuntimeError("outbox is off and no payment provider was given to call inline")
    if topic == CHARGE_TOPIC:
        resp = await ctx.provider.create_charge(payload["customer_id"], payload["amount_cents"], reference=key)
    else:
        resp = await ctx.provider.create_refund(payload["customer_id"], payload["amount_cents"], reference=key)
    return {**result, "status": "sent", "payment_id": resp["id"]}


async def _refuse_another_payment(conn, ctx: ToolContext, topic: str, key: str, payload: dict) -> None:
    """Return when the row queued under ``key`` is the payment ``topic`` and ``payload`` describe (same
    topic and :data:`PAYMENT_FIELDS`); else raise :class:`ToolError` (conflict) naming the queued one:
    "already queued" is an answer about the same arguments only (case C50). Under isolation the row is
    read through ``public.queued_payment``: a row of another tenant's thread is not shown, only refused."""
    query = QUEUED_FOR_TENANT if ctx.safeguards.isolation else QUEUED_UNDER_KEY
    row = await (await conn.execute(query, (key,))).fetchone()
    stored_topic, customer, amount = row if row is not None else (None, None, None)
    stored = {"customer_id": customer, "amount_cents": amount}
    if stored_topic == topic and all(_same(stored[f], payload.get(f)) for f in PAYMENT_FIELDS):
        return
    queued = f"a {_PAYMENT_KIND.get(stored_topic, 'payment')}"
    if type(amount) is int:
        queued += f" of {amount} cents"
    if type(customer) is int:
        queued += f" for customer {customer}"
    raise ToolError(ALREADY_QUEUED_OTHERWISE.format(queued=queued), Category.CONFLICT)


def _same(stored: Any, sent: Any) -> bool:
    """A JSON value read back equals the one sent: same type and value (``True`` is not ``1``)."""
    return type(stored) is type(sent) and stored == sent


# --------------------------------------------------------------------------- the worker


@dataclass
class DrainStats:
    """What a worker did: rows claimed, dispatched (found already paid counts too), retried, parked."""

    claimed: int = 0
    dispatched: int = 0
    reconciled: int = 0
    retried: int = 0
    dead_lettered: int = 0
    rounds: int = 0

    def add(self, other: DrainStats) -> None:
        for f in ("claimed", "dispatched", "reconciled", "retried", "dead_lettered", "rounds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))


@dataclass
class WorkerHooks:
    """Fault-injection points. ``after_provider_call(row_id)`` runs after the provider answered and
    before the row is marked; raising there is a worker crash (the claim transaction rolls back)."""

    after_provider_call: list[Hook] = field(default_factory=list)


class UnknownTopic(Exception):
    """Raised when an outbox row names a topic no dispatcher handles; the row is parked."""


class MalformedPayload(Exception):
    """Raised when an outbox row's payload lacks a field its topic needs, or holds one of the wrong type;
    the row is parked at once (it will not read better on a retry)."""


PAYMENT_FIELDS = {"customer_id": int, "amount_cents": int}
NOTIFY_FIELDS = {"to": str, "subject": str, "body": str}
MAX_ERROR_CHARS = 500


def _require(payload: Any, fields: dict[str, type]) -> None:
    """Raise :class:`MalformedPayload` unless ``payload`` is an object with each of ``fields`` of its type."""
    if not isinstance(payload, dict):
        raise MalformedPayload(f"payload is a {type(payload).__name__}, not an object")
    missing = [f for f in fields if f not in payload]
    if missing:
        raise MalformedPayload(f"payload has no {', '.join(missing)}")
    wrong = [f for f, t in fields.items() if not isinstance(payload[f], t) or isinstance(payload[f], bool)]
    if wrong:
        raise MalformedPayload(f"payload field {', '.join(wrong)} has the wrong type")


def _error_text(text: str) -> str:
    """``last_error`` as stored: no NUL (PostgreSQL text cannot hold one), at most MAX_ERROR_CHARS."""
    text = storable_text(text)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "\u2026"


class OutboxWorker:
    """Dispatches outbox rows to the provider (payments) and the notification sink (``notify.email``).

    Args:
        pool: an ``AsyncConnectionPool`` on the kit's database (autocommit connections).
        provider: the payment provider: ``find_by_reference(key)``, ``create_charge`` and ``create_refund``
            (``customer_id, amount_cents, *, idempotency_key, reference``), as
            :class:`agentlab.sim.provider.FakePaymentProvider` has.
        notifier: the notification sink (``find_by_reference``, ``send``); without one, ``notify.email``
            rows are parked.
        max_attempts: attempts before a row is parked as ``dead_letter``.
        backoff_s / backoff_cap_s: first retry delay and its cap, in seconds (doubling per attempt).
        batch_size: rows claimed per round.
        thread_id: dispatch only the rows this thread queued (experiments drain each episode's own
            intents, so one episode never waits out another's back-off); None: every row.
    """

    def __init__(self, pool, provider: Any, *, max_attempts: int = 5, backoff_s: float = 0.02,
                 backoff_cap_s: float = 2.0, batch_size: int = 20, notifier: Any = None,
                 thread_id: str | None = None):
        self.pool = pool
        self.provider = provider
        self.notifier = notifier
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self.batch_size = batch_size
        self.thread_id = thread_id
        self.hooks = WorkerHooks()

    async def run_once(self) -> DrainStats:
        """One round: up to ``batch_size`` due rows, each claimed, dispatched and marked in its own
        transaction. Returns what happened. A :class:`agentlab.core.errors.SimulatedCrash` from a hook
        propagates, rolling back only the row in hand; the rows marked before it stay marked."""
        stats = DrainStats(rounds=1)
        seen: list[int] = []
        async with self.pool.connection() as conn:
            while len(seen) < self.batch_size:
                async with conn.transaction():
                    cur = await conn.execute(CLAIM_ONE, {"thread": self.thread_id, "seen": seen})
                    row = await cur.fetchone()
                    if row is None:
                        break
                    seen.append(row[0])
                    stats.claimed += 1
                    await self._dispatch(conn, *row, stats)
        return stats

    async def _dispatch(self, conn, row_id, topic, payload, key, attempts, stats: DrainStats) -> None:
        try:
            if topic == NOTIFY_TOPIC and self.notifier is not None:
                _require(payload, NOTIFY_FIELDS)
                ref, found = await self._notify(payload, key)
            elif topic in (CHARGE_TOPIC, REFUND_TOPIC):
                _require(payload, PAYMENT_FIELDS)
                ref, found = await self._pay(topic, payload, key)
            else:
                raise UnknownTopic(f"no dispatcher for outbox topic {topic!r}")
            stats.reconciled += found
            await run_hooks(self.hooks.after_provider_call, row_id)
        except (IdempotencyConflict, ProviderRejected, UnknownTopic, MalformedPayload) as exc:
            log.error("outbox row %s parked: %s", row_id, exc)
            await conn.execute(MARK_DEAD, (_error_text(f"parked for a human: {exc}"), row_id))
            stats.dead_lettered += 1
            return
        except Exception as exc:  # ProviderError, TimeoutError, ConnectionError, or a bug: this row only
            if isinstance(exc, psycopg.Error) and is_infrastructure(exc):
                raise  # the database itself is gone (the kit's, or the provider's records): no row to mark
            if not isinstance(exc, (ProviderError, TimeoutError, ConnectionError)):
                log.exception("outbox row %s: unexpected error in its dispatch", row_id)
            if attempts + 1 >= self.max_attempts:
                await conn.execute(MARK_DEAD, (_error_text(f"gave up after {attempts + 1} attempts: "
                                                           f"{type(exc).__name__}: {exc}"), row_id))
                stats.dead_lettered += 1
            else:
                delay = min(self.backoff_cap_s, self.backoff_s * 2**attempts)
                await conn.execute(MARK_RETRY, (_error_text(f"{type(exc).__name__}: {exc}"), delay, row_id))
                stats.retried += 1
            return
        await conn.execute(MARK_DISPATCHED, (ref, row_id))
        stats.dispatched += 1

    async def _pay(self, topic: str, payload: dict, key: str) -> tuple[str, bool]:
        """Charge or refund once: the payment found by reference, else a new one under the row's key."""
        existing = await self.provider.find_by_reference(key)
        if existing:
            found = existing[0]
            if found["amount_cents"] != payload["amount_cents"]:
                raise IdempotencyConflict("a payment with this reference exists with other parameters")
            return found["id"], True
        call = self.provider.create_charge if topic == CHARGE_TOPIC else self.provider.create_refund
        resp = await call(payload["customer_id"], payload["amount_cents"], idempotency_key=key, reference=key)
        return resp["id"], False

    async def _notify(self, payload: dict, key: str) -> tuple[str, bool]:
        """Send a message once: the message found by reference, else a new delivery under the row's key."""
        existing = await self.notifier.find_by_reference(key)
        if existing:
            return existing[0]["id"], True
        resp = await self.notifier.send(payload["to"], payload["subject"], payload["body"], reference=key,
                                        corrects=payload.get("corrects"))
        return resp["id"], False

    async def drain(self, *, timeout_s: float = 30.0) -> DrainStats:
        """Run rounds until no pending row is left (waiting out back-offs), or ``timeout_s`` passes."""
        total = DrainStats()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            stats = await self.run_once()
            total.add(stats)
            if stats.claimed:
                continue
            async with self.pool.connection() as conn:
                row = await (await conn.execute(NEXT_DUE, {"thread": self.thread_id})).fetchone()
            if row is None or row[0] is None:
                break
            await asyncio.sleep(min(max(row[0].total_seconds(), 0.005), max(deadline - loop.time(), 0)))
        return total


async def outbox_counts(pool, thread_id: str | None = None) -> dict[str, int]:
    """Rows per outbox status, e.g. ``{"pending": 0, "dispatched": 2, "dead_letter": 0}``: of the whole
    outbox, or of the rows the thread ``thread_id`` queued."""
    async with pool.connection() as conn:
        if thread_id is None:
            rows = await (await conn.execute(COUNT_BY_STATUS)).fetchall()
        else:
            rows = await (await conn.execute(COUNT_BY_STATUS_OF_THREAD, (thread_id,))).fetchall()
    counts = {"pending": 0, "dispatched": 0, "dead_letter": 0}
    counts.update({s: n for s, n in rows})
    return counts
