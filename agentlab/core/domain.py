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
  code's bookkeeping; one of a generic kind (``payment_count``, say) replaces the lab's generic check of
  that kind for the domain;
- ``export_state(conn, ids) -> dict``: the domain's state as JSON, for a report or a hash;
- ``episode_rows(conn, ids, schema) -> list[dict]``: the episode's own rows as a lab result shows them, one
  dict per row (billing: each customer with its records and its payments at the provider); without it, the
  lab shows ``export_state``, or the rows' ids;
- ``faults``: the faults that fit the domain: names of the lab's generic faults, and :class:`Fault` values of
  its own (a hallucination its tools invite, a row its invariants guard held by another session...), which
  the lab's one registry, its chaos table and its widget take as they take the lab's own;
- ``races``: the domain's own races for the lab's concurrency family (:class:`agentlab.core.races.Races`: their
  rows, the two conversations' scenarios, where they meet, their invariants, how the two are judged); None: the
  family does not apply to it;
- ``error_hints``: :class:`agentlab.core.errors.ErrorHints`, what the translator tells the model for the
  domain's own constraints and which of its internal names must never reach it (the core's generic
  texts answer every constraint it does not name).
- ``shared_tables``: the tables (``"schema.name"``) its schema lets the agent role reach without row-level
  security on purpose, because every tenant may see them (a product catalogue, a single-tenant store).
  Any other such table is refused when the domain is migrated (:func:`migrate_domain`, case C42): the
  tools would see and change every tenant's rows there, whatever the thread's tenant.

The generic invariants (unanswered_call, leak, half_applied_batch, ledger_mismatch, payment_count) work
for any domain from the message history, the ledger and the provider (:mod:`agentlab.lab.invariants`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlab.core.agent_role import AGENT_ROLE, SHARED_TABLES
from agentlab.core.errors import DomainError, ErrorHints
from agentlab.core.isolation import unisolated_tables
from agentlab.core.leaks import find_leaks
from agentlab.core.migrations import CORE, Migration, apply_migrations
from agentlab.core.races import Races
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
    the ``scenario``, the message history ``messages``, ``applied`` (the tool calls, as
    ``{"name", "args", "id"}`` dicts, whose answer told the model they were applied, as the model reads
    it), the thread's ``tenant_id``, and ``memo``: a dict the domain's invariants share for one episode,
    so that several kinds can read the database once."""

    conn: Any
    thread_id: str
    ids: list[int]
    schema: str
    scenario: Any
    messages: list = field(default_factory=list)
    applied: list = field(default_factory=list)
    tenant_id: str | None = None
    memo: dict = field(default_factory=dict)


QUALIFIED_NAME = re.compile(r"^[^.\s]+\.[^.\s]+$")  # schema.name, as the catalog spells it (no quotes)
# Part of every domain's fingerprint: a template built before :func:`check_isolation` (or before it changed)
# was never checked, so it is not reused.
ISOLATION_CHECK = "agent role: row-level security or declared shared (C42)"
MISSING_TABLES = "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NULL"


@dataclass(frozen=True)
class Invariant:
    """A domain invariant: ``kind`` names its violations; ``check(ctx)`` returns the details of what is
    broken (one string each, empty when it holds), read from the database."""

    kind: str
    check: Callable[[InvariantContext], Awaitable[list[str]]]
    description: str = ""


@dataclass(frozen=True)
class Fault:
    """One named fault: what goes wrong in an episode, in phases a subclass overrides as it needs.

    The lab's catalog (:mod:`agentlab.lab.faults`) is built of these, and a domain brings its own in
    ``Domain.faults``; the lab runs both the same way (:meth:`agentlab.lab.runner.Lab.run`).

    Attributes:
        name: the fault's name (a row of the chaos table); unique among the lab's and the domain's.
        family: the family it belongs to (``agentlab.lab.faults.FAMILIES``, ``"control"``, or the domain's own).
        title: one line: what happens.
        guarded_by: the safeguard expected to hold it (documentation; nothing reads it to decide).
        scenarios: the scenarios it fits; an episode picks one with its seed (empty: every scenario of the
            domain).
        resumes: the episode crashes and resumes from a checkpoint (needs one per super-step).
        rearms: the fault lives in the code, so the restarted process has it too: ``arm`` runs again on
            the new process (``run.process``, its tools node ``run.node``) before the thread resumes. A fault that must strike
            once then guards itself (``run.notes.get("crashes")``); the lab's own faults do not rearm.
    """

    name: str
    family: str
    title: str
    guarded_by: str
    scenarios: tuple[str, ...] = ()

    resumes = False
    restarts_server = False  # it restarts the database server: its episodes run alone, after the others
    forced_durability = None  # the LangGraph durability the fault needs (None: the runner's choice)
    resubmits = False  # a resume that finds no checkpoint sends the prompt again (with new tool call ids)
    rearms = False  # armed again in the restarted process (see the class docstring)

    def resumes_graph(self, safeguards) -> bool:
        """Whether the episode's graph may crash and resume from a checkpoint under ``safeguards`` (it then
        needs a checkpoint per super-step)."""
        return self.resumes

    def prepare(self, scenario: Any, rng: Any) -> Any:
        """The scenario the model will play (hallucinations go here); ``rng`` a ``random.Random``. Pure."""
        return scenario

    def episode_safeguards(self, safeguards):
        """The safeguards the episode runs under: ``safeguards`` itself, unless the fault scales a timeout
        down so that the lab waits less (every switch and the name stay). Pure."""
        return safeguards

    async def install(self, pool) -> None:
        """Database objects the fault needs, created once per database (idempotent)."""

    async def arm(self, run: Any) -> None:
        """Inject the fault into ``run`` (an ``agentlab.lab.runner.EpisodeRun``) before the graph starts."""

    async def before_restart(self, run: Any) -> None:
        """Runs after the crash and before the new process resumes the thread."""

    async def disarm(self, run: Any) -> None:
        """Remove whatever the fault left behind (always runs)."""


@dataclass(frozen=True)
class Domain:
    """A domain the safety net protects (see the module docstring for each field).

    Raises:
        DomainError: from :meth:`validate`: a tool that is not strict, two tools with one name (both from
            the :class:`Toolset`), a scenario calling a tool the domain lacks, two invariants of one kind,
            a migration without SQL, error hints that are not an ``ErrorHints`` or whose texts leak, two
            faults of one name, a shared table not named ``"schema.name"``; from :func:`migrate_domain`: a
            table the agent role can reach without row-level security that ``shared_tables`` does not declare.
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
    episode_rows: Callable[[Any, list[int], str], Awaitable[list[dict]]] | None = None
    races: Races | None = None
    faults: tuple[str | Fault, ...] | None = None
    tenant_id: str = "acme"
    description: str = ""
    error_hints: ErrorHints = field(default_factory=ErrorHints)
    shared_tables: tuple[str, ...] = ()

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
        self._validate_faults()
        if self.races is not None and not isinstance(self.races, Races):
            raise DomainError(f"domain {self.name!r}: races must be an agentlab.core.races.Races or None")
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
        _check_shared_tables(self.name, self.shared_tables)

    def fingerprint(self) -> str:
        """Changes whenever the domain's template would: its migrations (their checksums), the tables it
        declares shared and the check they pass (:data:`ISOLATION_CHECK`), its seed function's code and the
        bytes of its ``seed_files``.

        Raises:
            DomainError: a seed file cannot be read.
        """
        parts = [self.name, *(m.checksum for m in self.migrations), ISOLATION_CHECK, *sorted(self.shared_tables)]
        if self.seed is not None:
            code = getattr(self.seed, "__code__", None)
            parts.append(code.co_code.hex() if code is not None else repr(self.seed))
        for f in self.seed_files:
            try:
                parts.append(hashlib.sha256(Path(f).read_bytes()).hexdigest())
            except OSError as exc:
                raise DomainError(f"domain {self.name!r}: cannot read its seed file {f} ({exc.strerror or exc})") from exc
        return hashlib.sha256("\n--\n".join(parts).encode()).hexdigest()

    def _validate_faults(self) -> None:
        """Raise DomainError for two faults of one name, or a fault naming a scenario the domain lacks."""
        names = [f.name if isinstance(f, Fault) else f for f in self.faults or ()]
        if any(not isinstance(n, str) for n in names) or len(names) != len(set(names)):
            raise DomainError(f"domain {self.name!r}: faults must be fault names or agentlab.Fault values with "
                              f"distinct names ({names})")
        for f in self.own_faults().values():
            unknown = [n for n in f.scenarios if n not in self.scenarios]
            if unknown:
                raise DomainError(f"domain {self.name!r}: fault {f.name!r} names scenarios it does not have "
                                  f"({', '.join(unknown)}); name some of {', '.join(self.scenarios)} or none (all)")

    def own_faults(self) -> dict[str, Fault]:
        """The faults the domain brings itself (its :class:`Fault` values in ``faults``), by name."""
        return {f.name: f for f in self.faults or () if isinstance(f, Fault)}

    def get_scenario(self, name: str) -> Any:
        """The named scenario. Raises ValueError naming the known ones."""
        try:
            return self.scenarios[name]
        except KeyError:
            raise ValueError(f"domain {self.name!r} has no scenario {name!r}; choose one of: "
                             f"{', '.join(self.scenarios)}") from None


def _check_shared_tables(name: str, shared_tables) -> None:
    """Raise :class:`DomainError` unless ``shared_tables`` is a tuple (or list) of ``"schema.name"`` strings."""
    if isinstance(shared_tables, str) or not all(isinstance(t, str) and QUALIFIED_NAME.match(t) for t in shared_tables):
        raise DomainError(f"domain {name!r}: shared_tables must be a tuple of \"schema.name\" strings, "
                          f"not {shared_tables!r}")


def migrate_domain(conn, domain: Domain) -> list[int]:
    """Apply ``domain``'s migrations that the database at ``conn`` (a sync psycopg connection,
    autocommit) lacks, recorded in ``schema_migrations`` under the domain's name with their checksums,
    then check the result (:func:`check_isolation`); return their versions. The migrations and the check
    are one transaction (each migration in a savepoint of its own): a refused domain leaves nothing applied.

    Raises:
        DomainError: an applied migration's SQL differs from the one recorded (an entry was edited, or
            the list reordered: migrations are append-only), or the database holds more migrations than
            the domain lists (:func:`agentlab.core.migrations.apply_migrations`); or the agent role can reach
            a table without row-level security that the domain does not declare shared.
    """
    with conn.transaction():
        applied = apply_migrations(conn, domain.name, domain.migrations)
        check_isolation(conn, domain)
    return applied


def check_isolation(conn, domain: Domain) -> None:
    """Refuse ``domain`` unless every table the agent role can reach in ``conn``'s database (a sync psycopg
    connection) has row-level security on, or is declared shared (the core's
    :data:`agentlab.core.agent_role.SHARED_TABLES` and ``domain.shared_tables``); read from the catalog
    (:func:`agentlab.core.isolation.unisolated_tables`), so it holds whatever the migrations' SQL says.

    Raises:
        DomainError: naming each such table and what the role may do there, or a declared shared table
            that does not exist.
    """
    missing = [name for name, in conn.execute(MISSING_TABLES, (list(domain.shared_tables),)).fetchall()]
    if missing:
        raise DomainError(f"domain {domain.name!r} declares {', '.join(missing)} shared, but its migrations "
                          "create no such table; name each as \"schema.name\"")
    shared = {*SHARED_TABLES, *domain.shared_tables}
    open_ = {name: privileges for name, privileges in unisolated_tables(conn).items() if name not in shared}
    if open_:
        reached = " and ".join(f"{name} ({', '.join(privileges)})" for name, privileges in open_.items())
        raise DomainError(
            f"domain {domain.name!r}: the agent role {AGENT_ROLE} can reach {reached} without row-level "
            "security, so a tool would see and change every tenant's rows there; enable row-level security "
            f"with a policy for {AGENT_ROLE} that reads the thread's tenant (examples/payouts.py shows how), "
            f"or, if every tenant may share it, declare it: Domain(shared_tables={tuple(open_)!r})")
