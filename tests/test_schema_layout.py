"""The core schema holds only the pattern's tables; billing's come from its own migrations; a template is
reused only when what built it matches the code (checksums), and a stale one is rebuilt."""

from __future__ import annotations

import logging
import secrets

import psycopg
import pytest

from agentlab import AGENT_ROLE, Domain, DomainError, Migration, Toolset
from agentlab.core import schema
from agentlab.domains.billing import DOMAIN as BILLING
from agentlab.domains.billing.schema import BUSINESS_TABLES
from agentlab.runtime import databases, db

TABLES = """
SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname IN ('public', 'lax') ORDER BY 1
"""
BILLING_TABLES = {f"{s}.{t}" for s in ("public", "lax") for t in BUSINESS_TABLES}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {r[0] for r in conn.execute(TABLES).fetchall()}


def _recorded(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT owner, checksum FROM schema_migrations ORDER BY owner, version").fetchall()
    out: dict[str, list[str]] = {}
    for owner, checksum in rows:
        out.setdefault(owner, []).append(checksum)
    return out


def test_the_core_template_holds_no_billing_table_and_billing_brings_its_own():
    core_url = db.with_dbname(db.server_url(), db.ensure_template(Domain(
        "bare", toolset=Toolset([]), scenarios={}, create_rows=None)))
    assert db.template_name(Domain("bare", toolset=Toolset([]), scenarios={}, create_rows=None)) == db.core_template_name()
    core_tables = _tables(core_url)
    assert {"public.tool_executions", "public.outbox", "public.events", "public.thread_tenants"} <= core_tables
    assert not core_tables & BILLING_TABLES
    assert _recorded(core_url) == {"core": [m.checksum for m in schema.MIGRATIONS]}

    url = db.create_database("layout")  # the default domain: billing
    try:
        assert BILLING_TABLES <= _tables(url)
        assert _recorded(url) == {"core": [m.checksum for m in schema.MIGRATIONS],
                                  "billing": [m.checksum for m in BILLING.migrations]}
        with psycopg.connect(url, autocommit=True) as conn:
            # the seed customers in both copies, the sequence past them, the agent role's grants and policies
            assert conn.execute("SELECT count(*) FROM public.customers").fetchone()[0] == 6
            assert conn.execute("SELECT count(*) FROM lax.customers").fetchone()[0] == 6
            assert conn.execute("SELECT last_value FROM customers_id_seq").fetchone()[0] == 6
            assert conn.execute("SELECT has_table_privilege(%s, 'public.refunds', 'INSERT')",
                                (AGENT_ROLE,)).fetchone()[0]
            policies = {r[0] for r in conn.execute("SELECT policyname FROM pg_policies").fetchall()}
        assert {"customers_tenant", "invoices_tenant", "credit_memos_tenant", "refunds_tenant",
                "tool_executions_tenant", "thread_tenants_tenant", "credit_redemptions_tenant",
                "tool_executions_lookup", "thread_tenants_lookup"} == policies  # the last two: C45
    finally:
        db.drop_database(url)


def test_a_stale_template_is_rebuilt_not_reused(caplog, tmp_path):
    seed_file = tmp_path / "rows.txt"
    seed_file.write_text("3\n")

    def seed(conn) -> None:
        conn.execute(f"INSERT INTO stale.item (n) SELECT generate_series(1, {int(seed_file.read_text())})")

    name = f"stale{secrets.token_hex(3)}"
    domain = Domain(name, toolset=Toolset([]), scenarios={}, create_rows=None, seed=seed, seed_files=(seed_file,),
                    migrations=(Migration("items", "CREATE SCHEMA IF NOT EXISTS stale; "
                                                   "CREATE TABLE stale.item (n int)"),))
    template = db.ensure_template(domain)
    try:
        with db.admin_connection() as conn:
            oid = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (template,)).fetchone()[0]
            assert db.ensure_template(domain) == template  # reused: same database
            assert conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (template,)).fetchone()[0] == oid
            # a template whose recorded build is not this code's (as one built by other migrations would be)
            conn.execute(f'COMMENT ON DATABASE "{template}" IS \'agentlab template 0000\'')
        with caplog.at_level(logging.WARNING, logger="agentlab.runtime.databases"):
            assert db.ensure_template(domain) == template
        assert "is stale" in caplog.text
        with db.admin_connection() as conn:
            assert conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (template,)).fetchone()[0] != oid
            assert databases.template_comment(conn, template) == db.template_fingerprint(domain)
        # the seed file's bytes are part of the fingerprint: another file, another template
        seed_file.write_text("5\n")
        assert db.template_name(domain) != template
        url = db.create_database("stale", domain)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                assert conn.execute("SELECT count(*) FROM stale.item").fetchone()[0] == 5
        finally:
            db.drop_database(url)
            db.drop_database(db.template_name(domain))
    finally:
        db.drop_database(template)


def test_an_edited_core_migration_and_an_earlier_layout_are_refused(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert schema.migrate(conn) == []  # a fresh database already holds every core migration
        edited = list(schema.MIGRATIONS)
        edited[3] = Migration(edited[3].name, edited[3].sql + "\nSELECT 1;")
        with pytest.raises(DomainError, match="the core schema: migration 3 .* was edited"):
            schema.apply_migrations(conn, schema.CORE, edited)
        with pytest.raises(DomainError, match="no longer lists"):
            schema.apply_migrations(conn, schema.CORE, schema.MIGRATIONS[:-1])
        conn.execute("ALTER TABLE schema_migrations DROP COLUMN checksum")
        with pytest.raises(DomainError, match="migrated by an earlier agentlab"):
            schema.migrate(conn)


def test_no_domain_may_take_the_cores_name():
    with pytest.raises(DomainError, match="may not be named 'core'"):
        Domain("core", toolset=Toolset([]), scenarios={}, create_rows=None)
