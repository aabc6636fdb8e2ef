"""The domain API: what a domain brings to the safety net, and the checks it must pass before any episode.

A :class:`Domain` bundles what is domain-specific; the tools node, the graph, the Harness, the failure
lab, ``python -m agentlab demo --domain ...`` and ``chaos --domain ...`` take one, and nothing in the kit mutates module
globals to learn about it:

- ``toolset``: the tools (:class:`agentlab.core.toolspec.Toolset`: strict argument models, handlers on
  the node's connection, ``writes`` / ``external``);
- ``migrations``: its schema as an append-only list of :class:`Migration` in a PostgreSQL schema of its
  own (``schema``), recorded under the domain's name in ``schema_migrations`` with a checksum, so an entry
  edited after it was applied is refused (:func:`migrate_domain`); the core's own tables (ledger, outbox,
  events, ...) are :data:`agentlab.core.schema.MIGRATIONS`, applied before any domain's;
- ``seed``: rows every fresh database starts with (``seed(conn)`` on a sync psycopg connection, run once
  into the domain's template database); ``seed_files``: the files it reads, whose bytes count in
  :meth:`Domain.fingerprint` (edit one and the template is rebuilt);
- ``scenarios``: scripted episodes (``Scenario`` values whose steps are planned tool calls; ``C(i)``
  names the ``i``-th row ``create_rows`` made for the episode);
- ``create_rows(conn, scenario, schema) -> list[int]``: the episode's own rows (so episodes never touch
  each other's data);
- ``invariants``: :class:`Invariant` checks read from the database and the provider, never from the
  code's bookkeeping;
- ``export_state(conn, ids) -> dict``: the domain's state as JSON, for a report or a hash;
- ``error_hints``: :class:`agentlab.core.errors.ErrorHints`, what the translator tells the model for the
  domain's own constraints and which of its internal names must never reach it (the core's generic
  texts answer every constraint it does not name).

The generic invariants (unanswered_call, leak, half_applied_batch, ledger_mismatch, payment_count) work
for any domain from the message history, the ledger and the provider (:mod:`agentlab.lab.invariants`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlab.core.errors import DomainError, ErrorHints, find_leaks
from agentlab.core.schema import CORE, Migration, apply_migrations
from agentlab.core.toolspec import Toolset


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its kind, the thread, and a one-line detail."""

    kind: str
    thread_id: str
    detail: str


@dataclass
class InvariantContext:
    """What an invariant reads: ``conn`` (an async connection, autocommit, the kit's own role), the
    episode's ``thread_id``, ``ids`` (the rows ``create_rows`` made), ``schema`` (where its tools wrote),
    the ``scenario`` and the message history ``messages``."""

    conn: Any
    thread_id: str
    ids: list[int]
    schema: str
    scenario: Any
    messages: list = field(default_factory=list)


@dataclass(frozen=True)
class Invariant:
    """A domain invariant: ``kind`` names its violations; ``check(ctx)`` returns the details of what is
    broken (one string each, empty when it holds), read from the database."""

    kind: str
    check: Callable[[InvariantContext], Awaitable[list[str]]]
    description: str = ""


@dataclass(frozen=True)
class Domain:
    """A domain the safety net protects (see the module docstring for each field).

    Raises:
        DomainError: from :meth:`validate`: a tool that is not strict, two tools with one name (both from
            the :class:`Toolset`), a scenario calling a tool the domain lacks, two invariants of one kind,
            a migration without SQL, error hints that are not an ``ErrorHints`` or whose texts leak.
    """

    name: str
    toolset: Toolset
    scenarios: Mapping[str, Any]
    create_rows: Callable[[Any, Any, str], Awaitable[list[int]]]
    schema: str = "public"
    migrations: tuple[Migration, ...] = ()
    seed: Callable[[Any], None] | None = None
    seed_files: tuple[str | Path, ...] = ()
    invariants: tuple[Invariant, ...] = ()
    export_state: Callable[[Any, list[int]], Awaitable[dict]] | None = None
    faults: tuple[str, ...] | None = None
    tenant_id: str = "acme"
    description: str = ""
    error_hints: ErrorHints = field(default_factory=ErrorHints)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not self.name.isidentifier():
            raise DomainError(f"a domain's name must be a plain identifier, not {self.name!r}")
        if self.name == CORE:
            raise DomainError(f"a domain may not be named {CORE!r}: the kit's own migrations are recorded under it")
        if not isinstance(self.toolset, Toolset):
            raise DomainError(f"domain {self.name!r}: toolset must be an agentlab.Toolset")
        for sname, sc in self.scenarios.items():
            for step in getattr(sc, "steps", ()):
                for call in step:
                    if call.tool not in self.toolset:
                        raise DomainError(f"domain {self.name!r}: scenario {sname!r} calls {call.tool!r}, "
                                          f"which is not one of its tools ({', '.join(self.toolset)})")
        kinds = [inv.kind for inv in self.invariants]
        if len(kinds) != len(set(kinds)):
            raise DomainError(f"domain {self.name!r}: two invariants share a kind ({kinds})")
        hints = self.error_hints
        if not isinstance(hints, ErrorHints):
            raise DomainError(f"domain {self.name!r}: error_hints must be an agentlab.core.errors.ErrorHints")
        for key, text in [*hints.constraints.items(), *hints.sqlstates.items()]:
            if not isinstance(text, str) or not text.strip() or find_leaks(text, hints.identifiers):
                raise DomainError(f"domain {self.name!r}: the error hint for {key!r} must be model-facing text "
                                  "without SQL or internal names")
        for n, m in enumerate(self.migrations):
            if not isinstance(m, Migration) or not m.sql.strip():
                raise DomainError(f"domain {self.name!r}: migration {n} must be a Migration with SQL")

    def fingerprint(self) -> str:
        """Changes whenever the domain's template would: its migrations (their checksums), its seed
        function's code and the bytes of its ``seed_files``.

        Raises:
            DomainError: a seed file cannot be read.
        """
        parts = [self.name, *(m.checksum for m in self.migrations)]
        if self.seed is not None:
            code = getattr(self.seed, "__code__", None)
            parts.append(code.co_code.hex() if code is not None else repr(self.seed))
        for f in self.seed_files:
            try:
                parts.append(hashlib.sha256(Path(f).read_bytes()).hexdigest())
            except OSError as exc:
                raise DomainError(f"domain {self.name!r}: cannot read its seed file {f} ({exc.strerror or exc})") from exc
        return hashlib.sha256("\n--\n".join(parts).encode()).hexdigest()

    def get_scenario(self, name: str) -> Any:
        """The named scenario. Raises ValueError naming the known ones."""
        try:
            return self.scenarios[name]
        except KeyError:
            raise ValueError(f"domain {self.name!r} has no scenario {name!r}; choose one of: "
                             f"{', '.join(self.scenarios)}") from None


def migrate_domain(conn, domain: Domain) -> list[int]:
    """Apply ``domain``'s migrations that the database at ``conn`` (a sync psycopg connection,
    autocommit) lacks, each in its own transaction, recorded in ``schema_migrations`` under the domain's
    name with their checksums; return their versions.

    Raises:
        DomainError: an applied migration's SQL differs from the one recorded (an entry was edited, or
            the list reordered: migrations are append-only), or the database holds more migrations than
            the domain lists (:func:`agentlab.core.schema.apply_migrations`).
    """
    return apply_migrations(conn, domain.name, domain.migrations)
