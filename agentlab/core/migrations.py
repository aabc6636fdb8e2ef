"""How any list of migrations is applied: :class:`Migration`, the ``schema_migrations`` table, and
:func:`apply_migrations`, which refuses a database whose recorded migrations differ from the code's.

Rules (as langgraph-checkpoint-postgres does it): a migration's position in its list is its version; an
entry is never edited or reordered, only appended. ``schema_migrations`` records each applied one with
its owner (:data:`CORE` or a domain's name), version, name and the SHA-256 of its stripped SQL. The core's
own list is :data:`agentlab.core.schema.MIGRATIONS`; a domain's is ``Domain.migrations``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import psycopg

from agentlab.core.errors import DomainError

CORE = "core"  # the owner name of the core's own migrations in schema_migrations


CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS public.schema_migrations (
    owner      text NOT NULL,
    version    integer NOT NULL,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, version)
)
"""
APPLIED_MIGRATIONS = "SELECT version, name, checksum FROM public.schema_migrations WHERE owner = %s ORDER BY version"
RECORD_MIGRATION = "INSERT INTO public.schema_migrations (owner, version, name, checksum) VALUES (%s, %s, %s, %s)"


@dataclass(frozen=True)
class Migration:
    """One schema change: a name and its SQL. Its position in its list is its version; ``checksum`` (the
    SHA-256 of the stripped SQL) is recorded when it is applied."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.strip().encode()).hexdigest()


def applied_checksums(conn: psycopg.Connection, owner: str) -> list[str]:
    """The checksums ``schema_migrations`` records for ``owner`` (``core`` or a domain's name), by version."""
    return [checksum for _, _, checksum in conn.execute(APPLIED_MIGRATIONS, (owner,)).fetchall()]


def apply_migrations(conn: psycopg.Connection, owner: str, migrations) -> list[int]:
    """Apply the entries of ``migrations`` (a sequence of :class:`Migration`) that ``conn``'s database
    (a sync connection, autocommit) lacks for ``owner``, each in its own transaction; return their versions.

    Raises:
        DomainError: an applied migration's SQL differs from the one recorded (an entry was edited, or the
            list reordered), the database holds more of ``owner``'s migrations than the list, or its
            ``schema_migrations`` has an earlier layout (a database made by an earlier agentlab).
    """
    with conn.transaction():
        conn.execute(CREATE_MIGRATIONS_TABLE)
    try:
        with conn.transaction():
            done = {v: (name, checksum) for v, name, checksum in conn.execute(APPLIED_MIGRATIONS, (owner,)).fetchall()}
    except psycopg.errors.UndefinedColumn:
        raise DomainError("this database was migrated by an earlier agentlab (its schema_migrations records no "
                          "checksums); make a fresh one (`python -m agentlab db reset` drops the kit's databases)"
                          ) from None
    who = "the core schema" if owner == CORE else f"domain {owner!r}"
    for version, (name, checksum) in sorted(done.items()):
        if version >= len(migrations):
            raise DomainError(f"{who}: the database holds migration {version} ({name!r}), which the code no "
                              "longer lists; migrations are append-only")
        if migrations[version].checksum != checksum:
            raise DomainError(f"{who}: migration {version} ({name!r}) was edited after it was applied; "
                              "migrations are append-only: add a new one instead")
    applied = []
    for version, m in enumerate(migrations):
        if version in done:
            continue
        with conn.transaction():
            conn.execute(m.sql)
            conn.execute(RECORD_MIGRATION, (owner, version, m.name, m.checksum))
        applied.append(version)
    return applied

