"""A fake notification sink (an e-mail service): the outside world, on its own connection and schema.

Like a plain mail relay it has no idempotency keys: every :meth:`FakeNotifier.send` delivers a new
message, so a message sent twice reaches the customer twice. What keeps a notification to one
delivery is the kit's outbox: the worker sends with the outbox row's dedupe key as the message's
``reference`` (an e-mail header the service stores and can search, as ``Message-ID`` or a custom
header is) and, before sending, looks that reference up (:meth:`FakeNotifier.find_by_reference`).

A message cannot be recalled. The only way to undo what a notification said is another message,
a correction, which names the message it corrects (``corrects``): what a saga's compensation of an
external step sends (:mod:`agentlab.durable.saga`, "sent but unwound").

Its records live in the schema ``notify`` (migration "fake notification sink's own records"), on
a pool of its own that opens on first use, so a rollback in the kit never unsends a message.
"""

from __future__ import annotations

import secrets

from agentlab.sim.provider import Clock, OutsideService

INSERT_MESSAGE = """
INSERT INTO notify.messages (id, recipient, subject, body, reference, corrects, created_at)
VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
FIND_MESSAGE_BY_REFERENCE = """
SELECT id, recipient, subject, body, reference, corrects, created_at
FROM notify.messages WHERE reference = %s ORDER BY created_at, id
"""
LIST_MESSAGES = """
SELECT id, recipient, subject, body, reference, corrects, created_at
FROM notify.messages WHERE (%(recipient)s::text IS NULL OR recipient = %(recipient)s) ORDER BY created_at, id
"""


class MailRelayTimeout(TimeoutError):
    """Raised by :meth:`FakeNotifier.send` for an injected failure: the relay did not answer, and
    nothing was delivered (the outbox worker backs off and retries)."""


class FakeNotifier(OutsideService):
    """The fake e-mail service. Use as ``async with FakeNotifier(url) as notifier:`` or let it open lazily.

    Args:
        url: conninfo of the database holding the ``notify`` schema.
        clock: the clock its timestamps come from (share the provider's to move time in a test).
    """

    def __init__(self, url: str, *, clock: Clock | None = None, behind_pooler: bool = False):
        super().__init__(url, min_size=0, max_size=2, behind_pooler=behind_pooler)
        self.clock = clock or Clock()
        self.sent = 0  # messages delivered by this instance, for the lab's tables (not used for any check)
        self._faults: list[str | None] = []  # one entry per injected failure: the reference it is for, or None

    def fail_next(self, times: int = 1, *, reference: str | None = None) -> None:
        """Make the next ``times`` sends (only those with ``reference`` when given) fail with
        :class:`MailRelayTimeout` before anything is delivered."""
        self._faults += [reference] * times

    async def send(self, recipient: str, subject: str, body: str, *, reference: str | None = None,
                   corrects: str | None = None) -> dict:
        """Deliver one message; returns ``{"id": "msg_...", ...}``. Every call delivers a new message.

        Raises:
            MailRelayTimeout: an injected failure (:meth:`fail_next`); nothing was delivered.
        """
        for i, wanted in enumerate(self._faults):
            if wanted is None or wanted == reference:
                del self._faults[i]
                raise MailRelayTimeout("the mail relay did not answer in time")
        await self.open()
        message_id = "msg_" + secrets.token_hex(8)
        async with self._pool.connection() as conn:
            await conn.execute(INSERT_MESSAGE, (message_id, recipient, subject, body, reference, corrects,
                                                self.clock.now()))
        self.sent += 1
        return {"id": message_id, "recipient": recipient, "subject": subject, "reference": reference,
                "corrects": corrects}

    async def find_by_reference(self, reference: str) -> list[dict]:
        """Messages delivered with ``reference``, oldest first."""
        return await self._records(FIND_MESSAGE_BY_REFERENCE, (reference,), _message)

    async def messages(self, recipient: str | None = None) -> list[dict]:
        """Every delivered message, or one recipient's, oldest first."""
        return await self._records(LIST_MESSAGES, {"recipient": recipient}, _message)


def _message(row) -> dict:
    return {"id": row[0], "recipient": row[1], "subject": row[2], "body": row[3], "reference": row[4],
            "corrects": row[5], "created_at": row[6]}
