"""psycopg's automatic prepared statements after an error in a pipeline.

psycopg prepares a statement on a connection once it has run ``prepare_threshold`` times there (5 by
default; the kit's tools pool keeps that default). In pipeline mode it queues the statement's Parse, records
the statement as prepared at once, and checks that record against the server's answer only for a statement
it had never seen on the connection (psycopg 3.3: ``PrepareManager.maybe_add_to_cache`` returns no key for a
statement promoted from its counts, so ``_maybe_prepare_gen`` queues nothing for
``BasePipeline._process_results`` to validate). When an earlier statement of the same pipeline segment
fails (a statement cancelled by ``statement_timeout``, SQLSTATE 57014; a constraint; an asyncio
cancellation, which psycopg turns into a cancel request), the server skips every message up to the next
Sync, that Parse included, yet the record stays: every later execution of the statement on that connection
binds a name the server never had and is refused with ``prepared statement "_pg3_N" does not exist``
(SQLSTATE 26000, ``psycopg.errors.InvalidSqlStatementName``), until the pool closes the connection.

:func:`forget_prepared` runs wherever the kit ends a pipeline that failed.

Sources: PostgreSQL docs "Frontend/Backend Protocol: Pipelining" (after an error the server discards
messages up to Sync); psycopg docs "Prepared statements" (``prepare_threshold``), "Pipeline mode support".
"""

from __future__ import annotations


def forget_prepared(conn) -> None:
    """Make ``conn``'s prepared-statement cache consistent with the server after a pipeline failed.

    psycopg forgets every statement it holds as prepared on ``conn`` and its counts, and sends
    ``DEALLOCATE ALL`` right after the next statement (in the same round trip when that statement is
    pipelined, one more otherwise), as ``Connection.rollback()`` does; statements are prepared again after
    ``prepare_threshold`` more executions. psycopg has no public call for it: on a psycopg without the
    cache this relies on, ``conn.prepare_threshold`` is set to None instead (no prepared statements on
    ``conn`` from then on; a stale name is then never sent). A closed ``conn`` is left alone (the pool
    discards it). No SQL is sent by this call; it raises nothing.

    Args:
        conn: a ``psycopg.AsyncConnection`` (or ``Connection``), in pipeline mode or not.
    """
    if conn.closed:
        return
    manager = getattr(conn, "_prepared", None)
    if manager is not None and callable(getattr(manager, "clear", None)):
        manager.clear()
    else:
        conn.prepare_threshold = None
