"""Isolation, the safeguard: each batch runs as the least-privilege agent role and the thread's tenant.

Under :attr:`agentlab.core.safeguards.Safeguards.isolation` the tools node starts each batch
transaction with ``set_config('role', AGENT_ROLE, true)`` and ``set_config(TENANT_SETTING, <tenant>,
true)`` (``SET LOCAL``: both end with the transaction, so a pooled connection comes back as its
owner). The tenant comes from the graph config (``config["configurable"]["tenant_id"]``), never from
a tool argument. What the role may do and the row-level security policies that read the setting are
a domain's schema; the lesson around them is :mod:`agentlab.lab.tenancy`.

Sources: PostgreSQL docs "Row Security Policies", "SET ROLE", "Customized Options".
"""

from __future__ import annotations

from typing import Any

from agentlab.core.errors import AgentlabError
from agentlab.core.schema import AGENT_ROLE, TENANT_SETTING

SET_AGENT_ROLE = "set_config('role', %s, true)"
SET_TENANT = f"set_config('{TENANT_SETTING}', %s, true)"


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
