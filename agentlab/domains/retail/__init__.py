"""tau2-bench's retail domain on PostgreSQL: schema, data load, export and the 16 tools.

From sierra-research/tau2-bench at commit a2c0247 (MIT; the data and its licence are in
``data/retail/``, see ``PROVENANCE.md`` there). The port keeps tau2's semantics so that replaying a
task's golden actions through :mod:`.tools` ends in the state tau2's own code ends in, compared by
:func:`canonical_hash` with ``data/retail/expected_hashes.json`` (written by
``scripts/tau2_expected_hashes.py`` from tau2's reference code).

- :mod:`.load`: :func:`create_schema` / :func:`create_schema_sync` (``schema.sql``, schema
  ``retail``), ``load.load`` / :func:`load_sync` (COPY), :func:`read_db_json`, :func:`read_tasks`,
  :func:`read_expected_hashes`. The async ``load`` is not re-exported here: the name would hide the
  submodule ``load`` (``from agentlab.domains.retail.load import load``).
- :mod:`.export`: :func:`export_state` / :func:`export_state_sync` (tau2's RetailDB JSON, money as
  floats) and :func:`canonical_hash`.
- :mod:`.domain`: :data:`DOMAIN` (the :class:`~agentlab.core.domain.Domain`: tools, migrations, seed,
  the 114 tasks as scenarios, invariants, export), :data:`DOMAIN_FIXED` (the last-variant bug fixed).
- :mod:`.tools`: :data:`SPECS`, ``(name, args_model, handler, writes, description)`` per tool, and the
  ``reproduce_last_variant_bug`` switch.
"""

from agentlab.domains.retail.domain import (
    DOMAIN,
    DOMAIN_FIXED,
    INVARIANTS,
    retail_domain,
    task_scenario,
)
from agentlab.domains.retail.export import (
    canonical_hash,
    export_state,
    export_state_sync,
    round_floats,
)
from agentlab.domains.retail.load import (
    create_schema,
    create_schema_sync,
    load_sync,
    read_db_json,
    read_expected_hashes,
    read_tasks,
    schema_sql,
)
from agentlab.domains.retail.tools import SPECS, WRITE_TOOLS, specs

__all__ = [
    "DOMAIN",
    "DOMAIN_FIXED",
    "INVARIANTS",
    "SPECS",
    "WRITE_TOOLS",
    "canonical_hash",
    "create_schema",
    "create_schema_sync",
    "export_state",
    "export_state_sync",
    "load_sync",
    "read_db_json",
    "read_expected_hashes",
    "read_tasks",
    "retail_domain",
    "round_floats",
    "schema_sql",
    "specs",
    "task_scenario",
]
