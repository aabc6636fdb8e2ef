"""Leak detection: whether a model-facing text gives away what the model must never see.

:func:`find_leaks` names the kinds of leak in a text (``dsn``, ``secret``, ``host``, ``sql``, ``identifier``,
``stack_trace``) from :data:`LEAK_PATTERNS` and the internal names in :data:`INTERNAL_IDENTIFIERS` (plus a
domain's own, ``ErrorHints.identifiers``). The translator (:mod:`agentlab.core.errors`) keeps such things out
of what it tells the model; the invariants and tests check every message with this.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# The core's internal identifiers that must never reach the model; a domain adds its own
# (ErrorHints.identifiers). Tool argument names (customer_id, amount_cents, ...) are the tools' public
# API and are allowed.
INTERNAL_IDENTIFIERS = (
    "tool_executions", "schema_migrations", "idempotency_key", "dedupe_key", "outbox", "checkpoint_blobs",
    "checkpoint_writes", "psycopg",
)
LEAK_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dsn", re.compile(r"postgres(?:ql)?://|\b(?:password|passwd|pwd|dbname|sslmode|user)\s*=", re.I)),
    ("secret", re.compile(r"\bpassword\b|\bsecret\b|\bsk_(?:live|test)_\w+", re.I)),
    ("host", re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\blocalhost\b|\.s\.PGSQL|\bhost\s*=|\bport\s*=", re.I)),
    ("sql", re.compile(r"\b(?:SELECT|INSERT|UPDATE|DELETE)\b[\s\S]{0,120}?\b(?:FROM|INTO|SET|WHERE)\b", re.I)),
    ("sql", re.compile(r"\b(?:LINE \d+:|DETAIL:|CONTEXT:|HINT:)|\b(?:SQLSTATE|syntax for type|violates)\b", re.I)),
    ("identifier", re.compile(r"\b(?:relation|constraint|column|table|schema)\s+\"[^\"]+\"", re.I)),
    ("identifier", re.compile(r"\b(?:public|lax|provider|pg_catalog)\.[A-Za-z_]\w*|\bpg_[a-z_]{3,}")),
    ("stack_trace", re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+")),
)


@functools.lru_cache(maxsize=32)
def _identifier_pattern(identifiers: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(i) for i in (*INTERNAL_IDENTIFIERS, *identifiers)) + r")(?!\w)",
                      re.I)


def find_leaks(text: str, identifiers: Iterable[str] = ()) -> list[str]:
    """Kinds of leak found in a model-facing ``text`` (empty when clean): dsn, secret, host, sql, identifier,
    stack_trace. ``identifiers``: a domain's internal names (``ErrorHints.identifiers``), flagged as
    identifier leaks on top of the core's :data:`INTERNAL_IDENTIFIERS`."""
    text = text or ""
    kinds = {kind for kind, pattern in LEAK_PATTERNS if pattern.search(text)}
    if _identifier_pattern(tuple(identifiers)).search(text):
        kinds.add("identifier")
    return sorted(kinds)
