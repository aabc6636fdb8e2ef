"""The fault catalog: what goes wrong around an agent, each injected by a real mechanism.

Twelve kinds of fault (:data:`FAMILIES`); the first, a hallucinated argument, comes in four
variants with their own names because different safeguards hold them. Every fault is scoped to its
own episode (its customers, its thread, its node and worker), so many episodes can run at once on
one database, one provider and one process.

===========================  ===============================================================================
fault                        mechanism
===========================  ===============================================================================
``wrong_type``               the model sends an amount in major units as a decimal (``25.0`` for 2500 cents)
``negative_amount``          the model sends a negative amount to a deduction
``stray_quote``              the model sends a customer id as text with a stray quote (``"12'"``)
``other_tenant_id``          the model names a customer of another tenant (one the episode created)
``check_violation``          the model deducts more credit than the customer has (CHECK)
``unique_violation``         the model creates a record again under the same natural key (UNIQUE)
``fk_violation``             the model names an invoice that does not exist (FOREIGN KEY)
``lock_timeout``             a second session holds ``SELECT ... FOR UPDATE`` on the customer's row
``statement_timeout``        a trigger sleeps inside the customer's UPDATE, past the statement timeout
``backend_killed``           another session runs ``pg_terminate_backend`` on the node's backend during call 2
``crash_before_checkpoint``  the process dies after the business COMMIT, before the checkpoint write;
                             the thread resumes from its checkpoint in a new process
``crash_mid_node``           the process dies before call 2 of a batch; the thread resumes in a new process
``provider_timeout``         the provider performs the payment, then the caller's request times out
``worker_crash``             the process calling the provider dies after the call and before recording it:
                             the outbox worker (outbox on) or the tools node calling inline (outbox off);
                             a new process resumes
``provider_forgot_key``      as ``worker_crash``, and the resume comes days later: the provider's clock has
                             moved past its idempotency-key retention
``wrong_order``              dependent calls in the wrong order in one step (the ``reorder`` scenario)
``none``                     no fault: the control row, every preset should hold
===========================  ===============================================================================

Hallucinations go into the script (:meth:`agentlab.domains.billing.scenarios.Scenario.with_call`), so the model
really emits them; ``fix`` is what a careful LLM sends once told which argument is wrong.
A fault never sets a flag the code under test reads: it holds real locks, kills real backends,
installs a real trigger, raises where a process would die, or asks the provider for its own
injected network failure.

``crash_under_exit`` (case C23, only when named: :data:`OPT_IN_FAULTS`) runs under ``durability="exit"``: the
crash after the business commit leaves no checkpoint, the prompt is sent again with new tool call ids,
and a call without a natural key applies twice under every preset.

``server_restart`` and ``server_restart_immediate`` (case C46, only when named) restart the database server
during call 2 of a batch (``pg_ctl restart -m fast`` / ``-m immediate``): every session on the server is cut,
so their episodes run one at a time after the others, on the kit's embedded server only.

The concurrency family (:data:`CONCURRENCY_FAULTS`: ``same_thread_runs``, ``double_submit``,
``lost_update``, ``check_then_act``, ``write_skew``) runs two conversations at once on the same rows,
their interleaving forced by a rendezvous between real transactions (:mod:`agentlab.lab.concurrency`); what
they do is the domain's races (``Domain.races``). It is selected by name and is not part of :data:`FAULTS`,
the default rows of the chaos table.

``get_fault(name)``,         :data:`FAULTS`; :meth:`agentlab.lab.runner.Lab.run` injects one into an episode.
"""

from __future__ import annotations

from agentlab.core.domain import Fault as DomainFault
from agentlab.lab.nemesis.arguments import (  # noqa: F401 (the catalog's names, importable from here as before)
    Hallucination,
    MissingInvoice,
    OtherTenant,
    OverBalance,
    RepeatNaturalKey,
    ScenarioFault,
    major_units,
    negated,
    with_stray_quote,
)
from agentlab.lab.nemesis.base import (  # noqa: F401 (the catalog's names, importable from here as before)
    CLEAN_SCENARIOS,
    FAMILIES,
    POLL_S,
    SERVER_GONE,
    WAIT_CAP_S,
    EpisodeRunLike,
    Fault,
)
from agentlab.lab.nemesis.concurrency import (  # noqa: F401 (the catalog's names, importable from here as before)
    CONCURRENCY_FAMILY,
    CONCURRENCY_FAULTS,
    RENDEZVOUS_S,
    Concurrent,
)
from agentlab.lab.nemesis.database import (  # noqa: F401 (the catalog's names, importable from here as before)
    LOCK_ROW,
    SLOW_ARM,
    SLOW_DDL,
    SLOW_DISARM,
    SLOW_INSTALLED,
    SLOW_SEEN,
    SLOW_SHOT_PREFIX,
    SOMEONE_WAITS_ON_ME,
    TERMINATE,
    KillBackend,
    LockHolder,
    SlowStatement,
    finish_background,
    one_shot_sql,
    slow_shot,
)
from agentlab.lab.nemesis.process import (  # noqa: F401 (the catalog's names, importable from here as before)
    CrashAfterCommit,
    CrashMidNode,
    CrashUnderExitDurability,
    ServerRestart,
)
from agentlab.lab.nemesis.provider import (  # noqa: F401 (the catalog's names, importable from here as before)
    PAYMENT_SCENARIOS,
    CrashAfterProviderCall,
    DiesAfterPayment,
    ProviderTimeoutAfterSuccess,
)

# --------------------------------------------------------------------------- the catalog

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("none", "control", "no fault: the control row", "-"),
    Hallucination("wrong_type", "hallucinated_argument", "an amount in major units as a decimal (25.0 for 2500 cents)",
                  "validation", ("refund", "invoice", "batch"), corrupt=major_units),
    Hallucination("negative_amount", "hallucinated_argument", "a negative amount sent to a deduction",
                  "validation", ("refund", "invoice", "batch"), corrupt=negated),
    Hallucination("stray_quote", "hallucinated_argument", "a customer id as text with a stray quote (\"12'\")",
                  "validation", CLEAN_SCENARIOS, tool="*", field="customer_id", corrupt=with_stray_quote, later_only=True),
    OtherTenant("other_tenant_id", "hallucinated_argument", "a customer id of another tenant",
                "isolation (row-level security)", ("refund", "invoice", "batch")),
    OverBalance("check_violation", "check_violation", "a deduction larger than the credit balance (CHECK)",
                "constraints", ("refund", "invoice", "batch")),
    RepeatNaturalKey("unique_violation", "unique_violation", "a record created again under its natural key (UNIQUE)",
                     "constraints"),
    MissingInvoice("fk_violation", "fk_violation", "a credit memo for an invoice id that does not exist (FOREIGN KEY)",
                   "constraints", ("refund", "topup")),
    LockHolder("lock_timeout", "lock_timeout", "a second session holds the customer's row lock", "timeouts"),
    SlowStatement("statement_timeout", "statement_timeout", "the customer's UPDATE runs past the statement timeout",
                  "timeouts"),
    KillBackend("backend_killed", "backend_killed", "pg_terminate_backend on the node's backend during call 2",
                "transaction"),
    CrashAfterCommit("crash_before_checkpoint", "crash_before_checkpoint",
                     "crash after the business commit, before the checkpoint; resume in a new process", "ledger"),
    CrashMidNode("crash_mid_node", "crash_mid_node", "crash before call 2 of a batch; resume in a new process",
                 "transaction"),
    ProviderTimeoutAfterSuccess("provider_timeout", "provider_timeout",
                                "the provider charges, then the request times out", "outbox"),
    CrashAfterProviderCall("worker_crash", "worker_crash",
                           "the caller of the provider dies after the call, before recording it", "outbox"),
    CrashAfterProviderCall("provider_forgot_key", "provider_forgot_key",
                           "as worker_crash, resumed days later: the provider forgot the idempotency key", "outbox",
                           forget_keys=True),
    ScenarioFault("wrong_order", "control", "dependent calls sent in the wrong order in one step", "savepoints",
                  ("reorder",)),
)}


OPT_IN_FAULTS: dict[str, Fault] = {f.name: f for f in (
    CrashUnderExitDurability("crash_under_exit", "crash_before_checkpoint",
                             "durability exit: crash after the business commit, no checkpoint; the prompt is sent again",
                             "none (run with durability sync or async)", ("refund", "invoice", "batch")),
    ServerRestart("server_restart", "backend_killed",
                  "pg_ctl restart -m fast during call 2: every session cut; resume once, then drain",
                  "transaction, ledger, the pools' check and the checkpointer's retried writes"),
    ServerRestart("server_restart_immediate", "backend_killed",
                  "pg_ctl restart -m immediate during call 2 (crash recovery): every session cut; resume once, then drain",
                  "transaction, ledger, the pools' check and the checkpointer's retried writes", mode="immediate"),
)}
"""Faults run only when named (``--faults crash_under_exit``, ``Lab.run("crash_under_exit")``), never by
default: no preset holds ``crash_under_exit``, so it stays out of the table every preset is meant to keep
clean; ``server_restart`` and ``server_restart_immediate`` restart the server every process on the machine
shares (the embedded one), so they run only when asked for."""



GENERIC_FAULTS = ("none", "backend_killed", "crash_before_checkpoint", "crash_mid_node")
"""Faults that need nothing of a domain but its tools node: they fit every domain and scenario."""


def faults_for(domain) -> tuple[str, ...]:
    """The names of the faults that fit ``domain`` (an :class:`agentlab.core.domain.Domain`; None: the whole
    catalog, :data:`FAULTS`), the same rule for every domain: the generic faults it does not list, then the
    faults its ``faults`` names, in its order (the catalog's by name, its own as :class:`Fault` values).
    Billing lists the whole catalog, which was written for it
    (:data:`agentlab.domains.billing.CATALOG_FAULTS`)."""
    if domain is None:
        return tuple(FAULTS)
    names = [f.name if isinstance(f, DomainFault) else f for f in domain.faults or ()]
    return tuple(dict.fromkeys((*(g for g in GENERIC_FAULTS if g not in names), *names)))


DOMAIN_RACES = ("billing", "retail")
"""The built-in domains with races of their own, kept for old imports: nothing reads it; the lab asks a domain
for its races (``Domain.races``, :class:`agentlab.core.races.Races`; billing's:
:data:`agentlab.domains.billing.concurrency.CONCURRENCY`, retail's:
:data:`agentlab.domains.retail.concurrency.CONCURRENCY`)."""


def domain_races(domain, fault_name: str) -> tuple[str, ...]:
    """The names of ``domain``'s own races (``domain.races``) for ``fault_name``. Raises ValueError when the
    fault does not apply to the domain (retail's ``write_skew``), naming why, or the domain states no races."""
    if domain.races is None:
        raise ValueError(f"domain {domain.name!r} states no races (Domain.races): the concurrency family "
                         f"does not apply to it")
    return domain.races.names(fault_name, domain.name)


def fault_scenarios(fault: DomainFault, domain) -> tuple[str, ...]:
    """The scenarios of ``domain`` an episode under ``fault`` may play; for a fault of the concurrency family, the
    names of the domain's races for it (:func:`domain_races`; ``domain`` None: the default domain's). Raises
    ValueError when the fault does not fit the domain."""
    if domain is not None and domain.own_faults().get(fault.name) is fault:  # the domain's own
        return fault.scenarios or tuple(domain.scenarios)
    if isinstance(fault, Concurrent):  # the domain's races (default: the default domain's, billing's)
        if domain is None:
            from agentlab.runtime.domains import resolve_domain

            domain = resolve_domain()
        return domain_races(domain, fault.name)
    if domain is None or (fault.scenarios and all(s in domain.scenarios for s in fault.scenarios)):
        return fault.scenarios  # a catalog fault in the domain it names scenarios of (billing's)
    if fault.name not in faults_for(domain):
        raise ValueError(f"fault {fault.name!r} does not fit domain {domain.name!r}; its faults: "
                         f"{', '.join(faults_for(domain))}")
    return tuple(domain.scenarios)


def injected_by_script(fault: Fault) -> bool:
    """Whether ``fault`` is injected through the scripted model's calls (a hallucination, a repeated natural
    key, a wrong order): a real model decides its own calls, so such a fault cannot be given to one."""
    return type(fault).prepare is not DomainFault.prepare or isinstance(fault, ScenarioFault)


def get_fault(name: str, domain=None) -> DomainFault:
    """The named fault: ``domain``'s own (:meth:`agentlab.core.domain.Domain.own_faults`), else the catalog's
    (:data:`FAULTS`, :data:`OPT_IN_FAULTS`, :data:`CONCURRENCY_FAMILY`). Raises ValueError naming the known faults."""
    own = domain.own_faults() if domain is not None else {}
    if name in own:
        return own[name]
    if name in CONCURRENCY_FAULTS:
        return CONCURRENCY_FAULTS[name]
    try:
        return FAULTS[name] if name in FAULTS else OPT_IN_FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; choose one of: "
                         f"{', '.join((*own, *FAULTS, *OPT_IN_FAULTS, *CONCURRENCY_FAMILY))}") from None


def fault_table(domain=None) -> list[dict[str, str]]:
    """The catalog as rows (name, family, title, guarded_by, scenarios), for a notebook or the CLI; with a
    ``domain``, the faults that fit it, its own included (their scenarios: the domain's where they name none)."""
    faults = list(FAULTS.values()) if domain is None else [get_fault(n, domain) for n in faults_for(domain)]
    return [{"fault": f.name, "family": f.family, "title": f.title, "guarded_by": f.guarded_by,
             "scenarios": ", ".join(f.scenarios if domain is None else fault_scenarios(f, domain))} for f in faults]


def check_catalog() -> None:
    """Raise AssertionError when a fault names a family outside :data:`FAMILIES`, ValueError when it names a
    scenario the default domain (billing) lacks."""
    from agentlab.runtime.domains import resolve_domain

    default = resolve_domain()  # the catalog was written for the default domain, billing
    for f in [*FAULTS.values(), *OPT_IN_FAULTS.values()]:
        for s in f.scenarios:
            default.get_scenario(s)
        assert f.family in (*FAMILIES, "control"), f.name
    assert set(FAMILIES) <= {f.family for f in FAULTS.values()}
