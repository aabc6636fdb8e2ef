"""A busy row, for real: a second session holding ``SELECT ... FOR UPDATE`` on a customer's row.

The kit's fault for a lock a tool must wait for (a ``lock_timeout`` or a saga step that backs off),
and for a compensation that cannot run.
"""

from __future__ import annotations

import psycopg

LOCK_CUSTOMER = "SELECT id FROM customers WHERE id = %s FOR UPDATE"


class RowLock:
    """A second session holding ``FOR UPDATE`` on a customer's row: the kit's real fault for a busy row.

    ``lock = await RowLock.acquire(url, customer_id)`` ... ``await lock.release()``, or ``async with``.
    """

    def __init__(self, conn):
        self.conn = conn
        self.released = False

    @classmethod
    async def acquire(cls, url: str, customer_id: int) -> RowLock:
        conn = await psycopg.AsyncConnection.connect(url)
        await conn.execute(LOCK_CUSTOMER, (customer_id,))
        return cls(conn)

    async def release(self) -> None:
        """End the second session's transaction, and with it the lock (idempotent)."""
        if not self.released:
            self.released = True
            await self.conn.rollback()
            await self.conn.close()

    async def __aenter__(self) -> RowLock:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()
