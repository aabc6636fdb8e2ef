"""Isolation, the safeguard: each batch runs as the least-privilege agent role and the thread's tenant.

Under :attr:`agentlab.core.safeguards.Safeguards.isolation` the tools node runs on a pool that logs in
as ``AGENT_ROLE`` itself (:func:`agentlab.runtime.db.agent_conninfo`, case C45: no superuser to go back
to) and starts each batch transaction with ``set_config('role', AGENT_ROLE, true)`` and
``set_config(TENANT_SETTING, <tenant>, true)`` (``SET LOCAL``: both end with the transaction; the role is
a no-op on the agent's own login and still switches a node handed the owner's pool). The tenant comes from the graph config (``config["configurable"]["tenant_id"]``), never from
a tool argument. What the role may do and the row-level security policies that read the setting are
a domain's schema; the lesson around them is :mod:`agentlab.lab.tenancy`.

A table the role can reach without row-level security shows it every tenant's rows, whatever the
setting says: :func:`unisolated_tables` lists them from the catalog, and
:func:`agentlab.core.domain.migrate_domain` refuses a domain that leaves one undeclared (case C42).

Sources: PostgreSQL docs "Row Security Policies", "SET ROLE", "Customized Options", "System Information
Functions" (``has_table_privilege``, ``has_any_column_privilege``), "pg_class" (``relrowsecurity``).
"""

from __future__ import annotations

from typing import Any

from agentlab.core.agent_role import AGENT_ROLE, TENANT_SETTING
from agentlab.core.errors import AgentlabError

SET_AGENT_ROLE = "set_config('role', %s, true)"
SET_TENANT = f"set_config('{TENANT_SETTING}', %s, true)"
# Tables, views and foreign tables the role reaches (USAGE on the schema, and SELECT, INSERT or UPDATE on a
# column or DELETE or TRUNCATE on the relation, PUBLIC's grants included) with row-level security off:
# each with the privileges it holds there. Row security never applies to TRUNCATE, nor to a view's rows.
UNISOLATED_TABLES = """
SELECT n.nspname || '.' || c.relname,
       array_remove(ARRAY[
           CASE WHEN has_any_column_privilege(%(role)s, c.oid, 'SELECT') THEN 'SELECT' END,
           CASE WHEN has_any_column_privilege(%(role)s, c.oid, 'INSERT') THEN 'INSERT' END,
           CASE WHEN has_any_column_privilege(%(role)s, c.oid, 'UPDATE') THEN 'UPDATE' END,
           CASE WHEN has_table_privilege(%(role)s, c.oid, 'DELETE') THEN 'DELETE' END,
           CASE WHEN has_table_privilege(%(role)s, c.oid, 'TRUNCATE') THEN 'TRUNCATE' END], NULL)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relrowsecurity
  AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%%'
  AND has_schema_privilege(%(role)s, n.oid, 'USAGE')
  AND (has_any_column_privilege(%(role)s, c.oid, 'SELECT, INSERT, UPDATE')
       OR has_table_privilege(%(role)s, c.oid, 'DELETE, TRUNCATE'))
ORDER BY 1
"""


class TenantRequired(AgentlabError):
    """Raised when isolation is on and a batch names no tenant (``config["configurable"]["tenant_id"]``)."""


class TenantMismatch(AgentlabError):
    """Raised when a batch names a tenant other than the one its thread belongs to (``thread_tenants``);
    the batch is rolled back before any tool SQL ran."""


def require_tenant(tenant_id: Any) -> str:
    """Return ``tenant_id`` when it is a non-empty string.

    Raises:
        TenantRequired: it is missing, empty or not a string; nothing has been sent to the database.
    """
    if not isinstance(tenant_id, str) or not tenant_id.strip():
        raise TenantRequired(
            "tenant isolation is on but this batch names no tenant: put the thread's tenant in the graph "
            "config (run_config(thread_id, tenant_id=...), i.e. config['configurable']['tenant_id']) or pass "
            "tenant_id=... to run_batch; the tenant never comes from tool arguments"
        )
    return tenant_id


def isolation_prelude(tenant_id: Any) -> tuple[list[str], list[Any]]:
    """The select-list items (and their parameters) that switch a batch transaction to the agent role
    and the thread's tenant; the node puts them first in its prelude ``SELECT``. Both are local to the
    transaction (``is_local = true``).

    Raises:
        TenantRequired: no tenant.
    """
    return [SET_AGENT_ROLE, SET_TENANT], [AGENT_ROLE, require_tenant(tenant_id)]


def unisolated_tables(conn, role: str = AGENT_ROLE) -> dict[str, list[str]]:
    """The relations ``role`` can reach without row-level security in ``conn``'s database (a sync psycopg
    connection), each with the privileges it holds there (``SELECT``, ``INSERT``, ``UPDATE``, ``DELETE``,
    ``TRUNCATE``), read from the catalog (:data:`UNISOLATED_TABLES`); keys are ``schema.name``."""
    return {name: list(privileges) for name, privileges in conn.execute(UNISOLATED_TABLES, {"role": role}).fetchall()}
