"""Moved: the transactional tools node now lives in :mod:`agentlab.core.batch` (one module per concept).

Kept so that every public name of this module keeps working: import from ``agentlab.core.batch`` (or
``from agentlab import TransactionalToolsNode``) in new code.
"""

from agentlab.core.batch import (  # noqa: F401  (re-exported)
    BEGIN,
    BEGIN_AT,
    BIND_THREAD_TENANT,
    COMMIT,
    LEDGER_INSERT,
    LEDGER_LOOKUP,
    LEDGER_LOOKUP_WITH_ARGS,
    MAX_CALL_ID_CHARS,
    RELEASE_SAVEPOINT,
    ROLLBACK,
    ROLLBACK_TO_SAVEPOINT,
    SAVEPOINT,
    SAVEPOINT_NAME,
    THREAD_TENANT,
    BatchResult,
    CallResult,
    NodeHooks,
    Outcome,
    TransactionalToolsNode,
    idempotency_key,
)
from agentlab.core.batch.drafts import RESET_SEARCH_PATH, SET_SEARCH_PATH  # noqa: F401  (re-exported)
