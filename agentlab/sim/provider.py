"""A Stripe-like fake payment provider: the outside world, on its own connection and in its own schema.

It behaves as a real provider does where it matters for correctness (Stripe's documented rules for
``Idempotency-Key``): the first response per key is stored and returned again for a retry with the
same parameters; the same key with other parameters is refused (:class:`IdempotencyConflict`); keys
are forgotten after a retention (default 24 hours) measured on a clock tests can move. Payments also
carry a ``reference`` (Stripe: ``metadata``) that can be searched.

It is not inside the caller's transaction: it has its own connection pool, so a rollback in the kit
never undoes a payment, exactly as with a real provider.

Injected failures model the network, not the provider's bookkeeping: ``fail_next("timeout_after_success")``
performs and commits the payment, then raises :class:`ProviderTimeout` to the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from agentlab.core.errors import IdempotencyConflict, ProviderRejected, ProviderTimeout, ProviderUnavailable
from agentlab.core.outbox import MAX_PAYMENT_CENTS, customer_ref
from agentlab.core.pools import connection_pool

DEFAULT_RETENTION_S = 24 * 3600.0


class Clock:
    """The provider's clock: real time plus an offset that tests move with :meth:`advance`."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (e.g. ``3 * 86400`` for three days)."""
        self.offset += timedelta(seconds=seconds)


FIND_KEY = "SELECT request_hash, response, created_at FROM provider.idempotency_keys WHERE key = %s FOR UPDATE"
FORGET_KEY = "DELETE FROM provider.idempotency_keys WHERE key = %s"
STORE_KEY = (
    "INSERT INTO provider.idempotency_keys (key, request_hash, response, created_at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (key) DO NOTHING RETURNING key"
)
INSERT_PAYMENT = """
INSERT INTO provider.payments (id, kind, customer, amount_cents, currency, reference, idempotency_key, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""
FIND_BY_REFERENCE = """
SELECT id, kind, customer, amount_cents, currency, reference, created_at
FROM provider.payments WHERE reference = %s ORDER BY created_at
"""
LIST_PAYMENTS = """
SELECT id, kind, customer, amount_cents, currency, reference, created_at FROM provider.payments
WHERE (%(customer)s::text IS NULL OR customer = %(customer)s) ORDER BY created_at, id
"""


class OutsideService:
    """An outside system simulated on its own connection pool (never inside the kit's transactions).

    Use as ``async with Service(url) as service:`` or let it open on first use. ``behind_pooler``: the
    url is a transaction-mode pooler's, so no prepared statements (they live on one server session).
    """

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 4, behind_pooler: bool = False):
        self.url = url
        # hands out no connection a server restart killed (agentlab.core.pools, case C46); no tool runs here
        self._pool = connection_pool(url, min_size=min_size, max_size=max_size, session_reset=False,
                                     kwargs={"autocommit": True, **({"prepare_threshold": None} if behind_pooler else {})})
        self._opened = False
        self._open_lock = asyncio.Lock()

    async def open(self):
        async with self._open_lock:
            if not self._opened:
                await self._pool.open(wait=True)
                self._opened = True
        return self

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()
            self._opened = False

    async def __aenter__(self):
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _records(self, query: str, params, record: Callable[[tuple], dict]) -> list[dict]:
        """The rows of ``query`` on the service's own pool, each turned into a dict by ``record``."""
        await self.open()
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, params)
            return [record(r) for r in await cur.fetchall()]


class FakePaymentProvider(OutsideService):
    """The fake provider. Use as ``async with FakePaymentProvider(url) as provider:``.

    Args:
        url: conninfo of the database holding the ``provider`` schema.
        retention_s: how long an idempotency key is remembered, in seconds (Stripe: 24 h).
        clock: the clock keys age on; share one to move time in a test.
    """

    def __init__(self, url: str, *, retention_s: float = DEFAULT_RETENTION_S, clock: Clock | None = None,
                 behind_pooler: bool = False):
        super().__init__(url, behind_pooler=behind_pooler)
        self.retention_s = retention_s
        self.clock = clock or Clock()
        self._faults: deque[tuple[str, tuple[str | None, str | None]]] = deque()
        self.requests = 0  # calls received, for the lab's tables (not used for any check)
        self.request_log: list[tuple[str | None, str]] = []  # (idempotency key, body hash) per request received


    # ------------------------------------------------------------------ faults

    def fail_next(self, kind: str = "timeout_after_success", times: int = 1, *, customer_id: int | None = None,
                  reference: str | None = None) -> None:
        """Make the next ``times`` requests fail (only those for ``customer_id`` / ``reference`` when given,
        so that concurrent episodes sharing one provider each get only their own failures).

        ``kind``: ``"timeout_after_success"`` (do the work, commit, then raise ProviderTimeout) or
        ``"unavailable"`` (raise ProviderUnavailable before doing anything).
        """
        if kind not in ("timeout_after_success", "unavailable"):
            raise ValueError(f"unknown provider fault {kind!r}")
        match = (customer_ref(customer_id) if customer_id is not None else None, reference)
        self._faults.extend([(kind, match)] * times)

    def clear_faults(self, *, customer_id: int | None = None, reference: str | None = None) -> int:
        """Forget injected failures not used yet (only those for ``customer_id`` / ``reference`` when given);
        return how many were forgotten."""
        match = (customer_ref(customer_id) if customer_id is not None else None, reference)
        keep = deque(f for f in self._faults if (customer_id is not None or reference is not None) and f[1] != match)
        dropped, self._faults = len(self._faults) - len(keep), keep
        return dropped

    def _take_fault(self, customer: str, reference: str | None) -> str | None:
        for i, (kind, (want_customer, want_reference)) in enumerate(self._faults):
            if want_customer not in (None, customer) or want_reference not in (None, reference):
                continue
            del self._faults[i]
            return kind
        return None

    # ------------------------------------------------------------------ API

    async def create_charge(
        self, customer_id: int, amount_cents: int, *, idempotency_key: str | None = None, reference: str | None = None
    ) -> dict:
        """Charge a customer. Returns ``{"id": "ch_...", "amount_cents": ..., "replayed": bool, ...}``.

        Raises:
            IdempotencyConflict: the key was used with other parameters.
            ProviderRejected: an amount over :data:`agentlab.core.outbox.MAX_PAYMENT_CENTS` (refused every time).
            ProviderTimeout / ProviderUnavailable: injected network failures.
        """
        return await self._create("charge", customer_id, amount_cents, idempotency_key, reference)

    async def create_refund(
        self, customer_id: int, amount_cents: int, *, idempotency_key: str | None = None, reference: str | None = None
    ) -> dict:
        """Refund a customer; same contract as :meth:`create_charge`, ids start with ``re_``."""
        return await self._create("refund", customer_id, amount_cents, idempotency_key, reference)

    async def find_by_reference(self, reference: str) -> list[dict]:
        """Payments carrying ``reference`` (Stripe: search by metadata), oldest first."""
        return await self._records(FIND_BY_REFERENCE, (reference,), _payment)

    async def payments(self, customer_id: int | None = None) -> list[dict]:
        """Every payment, or one customer's, oldest first."""
        return await self._records(LIST_PAYMENTS, {"customer": customer_ref(customer_id) if customer_id else None},
                                   _payment)

    async def _create(self, kind, customer_id, amount_cents, key, reference) -> dict:
        await self.open()
        self.requests += 1
        body = {"kind": kind, "customer": customer_ref(customer_id), "amount_cents": amount_cents,
                "currency": "usd", "reference": reference}
        request_hash = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        self.request_log.append((key, request_hash))
        if amount_cents > MAX_PAYMENT_CENTS:  # Stripe: "Amount must be no more than $999,999.99"
            raise ProviderRejected(f"invalid_request_error (400): amount_too_large: the amount must be at most "
                                   f"{MAX_PAYMENT_CENTS} cents")
        fault = self._take_fault(customer_ref(customer_id), reference) if self._faults else None
        if fault == "unavailable":
            raise ProviderUnavailable("payment provider unavailable (503)")
        now = self.clock.now()
        if key is None:  # nothing to look up or store: the payment alone, one statement committing on its own
            payment_id = ("ch_" if kind == "charge" else "re_") + secrets.token_hex(8)
            async with self._pool.connection() as conn:
                await conn.execute(INSERT_PAYMENT, (payment_id, kind, body["customer"], amount_cents, "usd",
                                                    reference, None, now))
            response = {"id": payment_id, "kind": kind, "amount_cents": amount_cents,
                        "customer": body["customer"], "reference": reference, "replayed": False}
        else:
            response = await self._create_keyed(kind, body, amount_cents, key, reference, request_hash, now)
        if fault == "timeout_after_success":
            raise ProviderTimeout("payment provider did not answer in time")
        return response

    async def _create_keyed(self, kind, body, amount_cents, key, reference, request_hash, now) -> dict:
        """A request with an idempotency key, in one transaction: the key's stored response (a replay), or
        the payment and the key's row, sent together (one round trip), then COMMIT."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(FIND_KEY, (key,))
            row = await cur.fetchone()
            if row is not None and row[2] < now - timedelta(seconds=self.retention_s):
                await conn.execute(FORGET_KEY, (key,))  # the provider forgot this key
                row = None
            if row is not None:
                if row[0] != request_hash:
                    raise IdempotencyConflict(
                        "idempotency key reused with different parameters; the original request stands"
                    )
                return {**row[1], "replayed": True}
            payment_id = ("ch_" if kind == "charge" else "re_") + secrets.token_hex(8)
            response = {"id": payment_id, "kind": kind, "amount_cents": amount_cents,
                        "customer": body["customer"], "reference": reference}
            async with conn.pipeline():  # the payment and the key in one round trip
                await conn.execute(INSERT_PAYMENT, (payment_id, kind, body["customer"], amount_cents, "usd",
                                                    reference, key, now))
                stored = await conn.execute(STORE_KEY, (key, request_hash, Jsonb(response), now))
            if await stored.fetchone() is None:  # a concurrent request with the same key won
                raise ProviderTimeout("concurrent request with the same idempotency key; retry")
        return {**response, "replayed": False}


def _payment(row) -> dict:
    return {"id": row[0], "kind": row[1], "customer": row[2], "amount_cents": row[3], "currency": row[4],
            "reference": row[5], "created_at": row[6]}
