"""agentlab: keeping a database correct while an AI agent calls tools against it.

The public names are re-exported here, each loaded from its module on first use (PEP 562), so that
``python -m agentlab`` starts without importing LangGraph, pandas or matplotlib until a command needs
them; ``tests/test_public_api.py`` keeps ``__all__`` in step with :data:`_EXPORTS`.
"""

import importlib as _importlib
import logging as _logging

# module (under agentlab.) -> the public names it provides
_EXPORTS = {
    "bench.suite": (
        "run_bench",
    ),
    "core.agent_role": (
        "TENANT_PREDICATE",
    ),
    "core.checkpoints": (
        "RetryingSaver",
    ),
    "core.domain": (
        "Domain", "Invariant", "InvariantContext", "Migration", "Violation", "migrate_domain",
    ),
    "core.errors": (
        "AgentlabError", "Category", "DomainError", "ErrorHints", "IdempotencyConflict", "NotFound", "ProviderTimeout",
        "ProviderUnavailable", "SimulatedCrash", "ToolError", "UnknownTool", "is_infrastructure",
    ),
    "core.events": (
        "EventLog", "observe_node",
    ),
    "core.graph": (
        "AgentState", "build_graph", "repair_orphans", "retry_policy", "run_config",
    ),
    "core.isolation": (
        "TenantMismatch", "TenantRequired", "unisolated_tables",
    ),
    "core.leased_graph": (
        "LeasedGraph", "RunLeases",
    ),
    "core.messages": (
        "unanswered_tool_calls",
    ),
    "core.outbox": (
        "CHARGE_TOPIC", "DrainStats", "NOTIFY_TOPIC", "OutboxWorker", "REFUND_TOPIC", "enqueue", "outbox_counts",
        "send_payment",
    ),
    "core.pools": (
        "RESET_SESSION", "connection_pool",
    ),
    "core.run_lock": (
        "LeaseLost", "ThreadBusy", "ThreadLease", "acquire_lease", "invoke_with_lease", "keep_alive",
        "release_lease", "thread_lease",
    ),
    "core.safeguards": (
        "ISOLATION_LEVELS", "PRESETS", "PRESET_NOTES", "Policy", "Safeguards", "preset",
    ),
    "core.batch": (
        "BatchResult", "BudgetSpent", "CallBudgets", "CallResult", "Outcome", "TransactionalToolsNode",
        "idempotency_key",
    ),
    "core.scenario": (
        "C", "PlannedCall", "Scenario",
    ),
    "core.toolspec": (
        "StrictArgs", "ToolContext", "ToolSpec", "Toolset", "tool",
    ),
    "course.exercises": (
        "check", "solution",
    ),
    "demos.demo": (
        "render",
    ),
    "demos.payout_saga": (
        "backward_recovery", "escalation", "forward_recovery", "notice_model", "payout_effects",
        "payout_input", "payout_script", "store_credit_payout",
    ),
    "demos.report": (
        "episode_report",
    ),
    "domains.billing.concurrency": (
        "check_concurrency",
    ),
    "domains.billing.errors": (
        "RULES", "find_leaks", "translate",
    ),
    "domains.billing.rows": (
        "customer_rows", "new_customer",
    ),
    "domains.billing.scenarios": (
        "CustomerSpec", "Intended", "SCENARIOS", "get_scenario",
    ),
    "domains.billing.tools": (
        "Cents", "CustomerId", "TOOLS", "charge_dedupe_key", "get_tool", "tool_schemas",
    ),
    "domains.retail.domain": (
        "retail_domain",
    ),
    "durable.approval": (
        "APPROVAL", "ApprovalPolicy", "resume_days_later",
    ),
    "durable.approval_answers": (
        "edit_call", "reject_call",
    ),
    "durable.approval_review": (
        "approval_decisions", "approval_requests", "interrupts_of", "pending_requests", "resume_command",
    ),
    "durable.history": (
        "NoCheckpoint", "fork", "replay", "replay_and_fork_experiment", "resume_thread", "run_from", "thread_counts",
        "thread_history",
    ),
    "durable.jobs": (
        "JobFailed", "JobKeyConflict", "JobLost", "JobResult", "JobStatus", "JobStore", "JobTimeout",
    ),
    "durable.retention": (
        "RetentionPolicy", "RetentionReport", "apply_retention", "checkpoint_bytes", "retention_chart",
        "retention_experiment", "thread_activity",
    ),
    "durable.saga": (
        "AbortRefused", "Backoff", "RunStatus", "SagaBusy", "SagaDefinition", "SagaError", "SagaFenced", "SagaReport",
        "SagaRunner", "Step",
        "StepContext", "StepStatus",
    ),
    "durable.saga_frames": (
        "compensation_needed_frame", "saga_chart", "saga_log_frame", "saga_steps_frame",
    ),
    "lab.batches": (
        "batch_frame", "steps_frame", "tool_calls",
    ),
    "lab.tau2": (
        "TaskRun", "Tau2Result", "run_task", "run_tau2",
    ),
    "lab.agents": (
        "AgentContext", "AgentSpec", "kit_agent", "resolve_agent",
    ),
    "lab.agents.billing_tools": (
        "BASELINE_TOOL_NAMES", "billing_tools",
    ),
    "lab.agents.create_agent": (
        "build_create_agent",
    ),
    "lab.agents.toolnode": (
        "build_toolnode_agent",
    ),
    "lab.budgets": (
        "compare_budgets",
    ),
    "lab.charts": (
        "experiment_heatmap", "heatmap",
    ),
    "lab.checks": (
        "check_invariant",
    ),
    "lab.durable_faults": (
        "DURABLE_FAULTS", "DURABLE_KINDS", "DurableFault", "DurableRun", "check_payout_run", "check_retention_race",
        "durable_fault_table", "run_durable_fault",
    ),
    "lab.experiments": (
        "run_experiment",
    ),
    "lab.experiment_results": (
        "ExperimentResult", "safeguard_effects", "summarize",
    ),
    "lab.anomalies": (
        "isolation_matrix",
    ),
    "lab.rendezvous": (
        "Rendezvous",
    ),
    "lab.faults": (
        "CONCURRENCY_FAMILY", "CONCURRENCY_FAULTS", "FAMILIES", "FAULTS", "Fault", "fault_table", "get_fault",
    ),
    "lab.invariants": (
        "KINDS", "check_episode", "check_messages", "count_by_kind",
    ),
    "lab.ladder": (
        "ladder_chart", "rung_table",
    ),
    "lab.observability": (
        "episode_with_a_retry", "node_summary", "run_events", "timeline_chart",
    ),
    "lab.row_lock": (
        "RowLock",
    ),
    "lab.traces": (
        "span_frame", "trace_waterfall", "traced_episode",
    ),
    "lab.process": (
        "AgentProcess",
    ),
    "lab.runner": (
        "FaultRun", "Lab", "run_fault",
    ),
    "lab.session": (
        "LabResult", "LabSession", "lab_charts", "lab_run", "ledger_chart", "rollback_rate_chart",
    ),
    "lab.tenancy": (
        "AGENT_ROLE", "AgentProbe", "CrossTenantEffect", "FORBIDDEN_STATEMENTS", "agent_privileges",
        "compare_isolation", "create_foreign_customer", "cross_tenant_effects", "try_as_agent",
        "with_foreign_customer",
    ),
    "lab.widget": (
        "FailureLab",
    ),
    "lab.yardstick": (
        "AgentRun", "Yardstick",
    ),
    "lab.yardstick_faults": (
        "YARDSTICK_FAULTS", "register_fault",
    ),
    "lab.yardstick_table": (
        "YardstickResult", "run_yardstick", "versions",
    ),
    "runtime.conninfo": (
        "DatabaseMissing", "DatabaseUnavailable",
    ),
    "runtime.databases": (
        "create_database", "drop_database",
    ),
    "runtime.harness": (
        "Episode", "Harness", "HarnessClosed",
    ),
    "runtime.models": (
        "ModelUnavailable", "load_model", "probe_model",
    ),
    "runtime.notebook": (
        "open_notebook",
    ),
    "runtime.server": (
        "server_url",
    ),
    "sim.model": (
        "ScriptedChatModel", "classify",
    ),
    "sim.notifier": (
        "FakeNotifier",
    ),
    "sim.provider": (
        "Clock", "FakePaymentProvider",
    ),
}
_MODULE_OF = {name: f"agentlab.{module}" for module, names in _EXPORTS.items() for name in names}

_logging.getLogger("agentlab").addHandler(_logging.NullHandler())


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlab' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = sorted(_MODULE_OF)
