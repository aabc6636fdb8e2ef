"""The mechanics :mod:`agentlab.core.batch.pipelined` needs to share one pipeline across a batch's calls.

:class:`Pipeline` is entered by a call's first statement and left by the Sync :meth:`Pipeline.sync`
sends; :class:`Unanswered` is a call whose ledger row and RELEASE are queued and not yet answered;
:class:`Step` what one call settled. A lost connection inside a pipeline looks different from outside
one (:func:`lost`, :class:`FatalNotice`), and a statement the server skipped carries no SQLSTATE
(:func:`aborted`); after a failed pipeline psycopg's prepared statements are forgotten
(:func:`agentlab.core.prepared.forget_prepared`).

Sources: PostgreSQL docs "Frontend/Backend Protocol: Pipelining" (after an error the server skips every
message up to the next Sync); libpq "Pipeline Mode", "Notice Processing".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from agentlab.core.batch import savepoints
from agentlab.core.batch.calls import Call
from agentlab.core.batch.results import BatchEnd, CallResult
from agentlab.core.batch.savepoints import RELEASE_SAVEPOINT, ROLLBACK_TO_SAVEPOINT, SAVEPOINT_NAME
from agentlab.core.errors import Translation, is_infrastructure
from agentlab.core.prepared import forget_prepared

log = logging.getLogger(__name__)

SAVEPOINT = sql.SQL("SAVEPOINT {}").format(sql.Identifier(SAVEPOINT_NAME))


@dataclass
class Unanswered:
    """A call whose tool returned, its ledger row and RELEASE queued in the batch's pipeline, not yet answered."""

    call: Call
    result: CallResult  # APPLIED, once its RELEASE is answered
    release: Any  # the RELEASE's cursor: psycopg sets its pgresult when the server's answer is read

    @property
    def answered(self) -> bool:
        """True once the RELEASE succeeded: every statement of the call did. After a Sync, False means one failed."""
        return self.release.pgresult is not None


@dataclass
class Step:
    """What one call settled in the pipeline: its result (None when it is ``unanswered`` or must run
    ``again``), how the COMMIT sent with it ``ended`` (None when none was sent; ``commit_error`` says why
    it failed), and the outcome of the ``earlier`` call it carried the answers of."""

    result: CallResult | None = None
    ended: BatchEnd | None = None
    commit_error: Translation | None = None
    earlier: CallResult | None = None
    unanswered: Unanswered | None = None
    again: bool = False


class Pipeline:
    """The pipeline (psycopg's pipeline mode) the batch's calls share: entered by a call's first statement,
    left by the Sync :meth:`sync` sends; calls may follow each other in it between the two."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self._open = None

    async def enter(self) -> None:
        if self._open is None:
            cm = self.conn.pipeline()
            await cm.__aenter__()
            self._open = cm

    async def sync(self) -> Exception | None:
        """Leave the pipeline: its Sync goes out and every answer is read. Returns the first error the answers
        held (psycopg raises it on leaving; here it is returned), None when none did or no pipeline was open."""
        cm, self._open = self._open, None
        if cm is None:
            return None
        try:
            await cm.__aexit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 (the caller attributes it)
            return exc
        return None


async def rollback_quietly(conn) -> None:
    """:func:`agentlab.core.batch.savepoints.rollback_quietly`, after forgetting psycopg's prepared
    statements (the pipeline may have failed or been cancelled)."""
    forget_prepared(conn)
    await savepoints.rollback_quietly(conn)


async def undo_savepoint(conn) -> None:
    """ROLLBACK TO the call's savepoint and RELEASE it, pipelined (one round trip): the call is undone, the
    transaction usable again. A failure is logged (the call's own error is what the model is told) and
    leaves the transaction aborted, so the later calls meet SQLSTATE 25P02; a lost connection is raised.
    The call's pipeline failed, so psycopg's prepared statements are forgotten first, and again when this
    pipeline fails."""
    forget_prepared(conn)
    try:
        async with conn.pipeline():
            await conn.execute(ROLLBACK_TO_SAVEPOINT)
            await conn.execute(RELEASE_SAVEPOINT)
    except Exception as exc:
        forget_prepared(conn)
        if conn.broken or is_infrastructure(exc):
            raise
        log.warning("ROLLBACK TO the failed call's savepoint failed: %s", exc)


def aborted(exc: psycopg.errors.PipelineAborted) -> psycopg.errors.InFailedSqlTransaction:
    """What the server says outside a pipeline to a statement sent after an error in the same transaction
    (SQLSTATE 25P02), for a tool that caught its statement's error and went on: inside a pipeline the
    server skips that statement and psycopg raises ``PipelineAborted``, which carries no SQLSTATE."""
    error = psycopg.errors.InFailedSqlTransaction(
        "current transaction is aborted, commands ignored until end of transaction block")
    error.__cause__ = exc
    return error


class FatalNotice:
    """A notice handler keeping the last FATAL or PANIC report: the server's reason for closing the connection.

    Outside a pipeline libpq hands a terminated backend's ``FATAL`` message to the waiting statement as its
    error (``AdminShutdown``, SQLSTATE 57P01); inside one it arrives while no result is awaited, and libpq
    passes it to the notice handlers instead."""

    def __init__(self) -> None:
        self.sqlstate: str | None = None
        self.message: str | None = None

    def __call__(self, diag) -> None:  # diag is valid during the call only: its fields are copied
        if (diag.severity_nonlocalized or diag.severity) in ("FATAL", "PANIC") and diag.sqlstate:
            self.sqlstate, self.message = diag.sqlstate, diag.message_primary


def lost(conn, exc: Exception, fatal: FatalNotice) -> psycopg.OperationalError | None:
    """The error a lost connection raises outside a pipeline, for ``exc`` raised inside one; None when the
    connection is alive or ``exc`` already is that error.

    Outside a pipeline psycopg reports a terminated backend as the server's own error (``AdminShutdown``,
    SQLSTATE 57P01) and a vanished server as a :class:`psycopg.OperationalError`; the translator retries
    both. Inside a pipeline the same loss comes as "consuming input failed", ``PipelineAborted`` for the
    statements never answered, or a protocol error, while the server's reason went to the notice handlers
    (``fatal``). Here it becomes the error the server sent (the psycopg class of its SQLSTATE, with its
    message), else an ``OperationalError`` with the text psycopg gave (the caller chains ``exc``)."""
    if not (conn.closed or conn.broken):
        return None
    if fatal.sqlstate is not None and getattr(exc, "sqlstate", None) != fatal.sqlstate:
        try:
            cls = psycopg.errors.lookup(fatal.sqlstate)
        except KeyError:  # a SQLSTATE psycopg has no class for
            cls = None
        if cls is not None and issubclass(cls, psycopg.OperationalError):
            return cls(fatal.message or str(exc))
    if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.PipelineAborted):
        return None
    return psycopg.OperationalError(f"the connection was lost: {exc}")
