"""agentlab: keeping a database correct while an AI agent calls tools against it.

The public names are re-exported here, each loaded from its module on first use (PEP 562), so that
``python -m agentlab`` starts without importing LangGraph, pandas or matplotlib until a command needs
them; ``tests/test_public_api.py`` keeps ``__all__`` in step with :data:`_EXPORTS`.
"""

import importlib as _importlib
import logging as _logging

# module (under agentlab.) -> the public names it provides
_EXPORTS = {
    "approval": (
        "APPROVAL", "ApprovalPolicy", "approval_requests", "interrupts_of", "pending_requests", "resume_command",
    ),
    "batches": ("batch_frame", "customer_rows", "new_customer", "steps_frame", "tool_calls"),
    "bench": ("run_bench",),
    "charts": ("experiment_heatmap", "heatmap"),
    "db": ("DatabaseUnavailable", "create_database", "drop_database", "server_url"),
    "errors": (
        "AgentlabError", "Category", "NotFound", "SimulatedCrash", "ToolError", "UnknownTool", "find_leaks",
        "is_infrastructure", "translate",
    ),
    "events": ("EventLog",),
    "experiments": ("ExperimentResult", "run_experiment", "safeguard_effects", "summarize"),
    "failure_lab": ("LabResult", "LabSession", "lab_charts", "lab_run", "ledger_chart", "rollback_rate_chart"),
    "faults": ("FAMILIES", "FAULTS", "Fault", "fault_table", "get_fault"),
    "graph": ("AgentState", "build_graph", "repair_orphans", "retry_policy", "run_config", "unanswered_tool_calls"),
    "harness": ("Episode", "Harness"),
    "history": ("fork", "replay", "replay_and_fork_experiment", "run_from", "thread_counts", "thread_history"),
    "invariants": ("KINDS", "Violation", "check_episode", "check_messages", "count_by_kind"),
    "jobs": ("JobFailed", "JobLost", "JobResult", "JobStatus", "JobStore", "JobTimeout"),
    "lab": ("AgentProcess", "FaultRun", "Lab", "run_fault"),
    "ladder": ("ladder_chart", "rung_table"),
    "model": ("ScriptedChatModel", "load_model"),
    "node": ("BatchResult", "CallResult", "Outcome", "TransactionalToolsNode", "idempotency_key"),
    "notifier": ("FakeNotifier", "NOTIFY_TOPIC"),
    "observability": ("node_summary", "observe_node", "run_events", "timeline_chart"),
    "outbox": ("DrainStats", "OutboxWorker", "outbox_counts"),
    "provider": ("Clock", "FakePaymentProvider", "IdempotencyConflict", "ProviderTimeout", "ProviderUnavailable"),
    "refund_saga": ("RowLock", "payout_input", "store_credit_payout"),
    "retention": (
        "RetentionPolicy", "RetentionReport", "apply_retention", "checkpoint_bytes", "retention_chart",
        "retention_experiment", "thread_activity",
    ),
    "safeguards": ("PRESETS", "PRESET_NOTES", "Policy", "Safeguards", "preset"),
    "saga": (
        "Backoff", "RunStatus", "SagaBusy", "SagaDefinition", "SagaError", "SagaReport", "SagaRunner", "Step",
        "StepContext", "StepStatus",
    ),
    "saga_frames": ("compensation_needed_frame", "saga_chart", "saga_log_frame", "saga_steps_frame"),
    "scenarios": ("C", "CustomerSpec", "Intended", "PlannedCall", "SCENARIOS", "Scenario", "get_scenario"),
    "tenancy": (
        "AGENT_ROLE", "AgentProbe", "CrossTenantEffect", "TenantRequired", "agent_privileges", "compare_isolation",
        "create_foreign_customer", "cross_tenant_effects", "try_as_agent", "with_foreign_customer",
    ),
    "tools": ("TOOLS", "ToolSpec", "get_tool", "tool_schemas"),
    "widgets": ("FailureLab",),
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


__all__ = [
    "APPROVAL", "AgentState", "AgentlabError", "ApprovalPolicy", "Backoff", "BatchResult", "C", "CallResult",
    "Category", "Clock", "CustomerSpec", "DatabaseUnavailable", "DrainStats", "Episode", "EventLog", "FakeNotifier",
    "FakePaymentProvider", "Harness", "IdempotencyConflict", "Intended", "JobFailed", "JobLost", "JobResult",
    "JobStatus", "JobStore", "JobTimeout", "NOTIFY_TOPIC", "NotFound", "OutboxWorker", "Outcome", "PRESETS",
    "PRESET_NOTES", "PlannedCall", "Policy", "ProviderTimeout", "ProviderUnavailable", "RetentionPolicy",
    "RetentionReport", "RowLock", "RunStatus", "SCENARIOS", "Safeguards", "SagaBusy", "SagaDefinition", "SagaError",
    "SagaReport", "SagaRunner", "Scenario", "ScriptedChatModel", "Step", "StepContext", "StepStatus", "TOOLS",
    "ToolError", "ToolSpec", "TransactionalToolsNode", "UnknownTool", "apply_retention", "approval_requests",
    "build_graph", "checkpoint_bytes", "compensation_needed_frame", "create_database", "drop_database",
    "find_leaks", "fork", "get_scenario", "get_tool", "idempotency_key", "interrupts_of", "is_infrastructure",
    "load_model", "node_summary", "observe_node", "outbox_counts", "payout_input", "pending_requests", "preset",
    "repair_orphans", "replay", "replay_and_fork_experiment", "resume_command", "retention_chart",
    "retention_experiment", "retry_policy", "run_config", "run_events", "run_from", "saga_chart", "saga_log_frame",
    "saga_steps_frame", "server_url", "store_credit_payout", "thread_activity", "thread_counts", "thread_history",
    "timeline_chart", "tool_schemas", "translate", "unanswered_tool_calls",
    # tenant isolation (agentlab.tenancy)
    "AGENT_ROLE", "AgentProbe", "CrossTenantEffect", "TenantRequired", "agent_privileges", "compare_isolation",
    "create_foreign_customer", "cross_tenant_effects", "try_as_agent", "with_foreign_customer",
    # the bench (agentlab.bench)
    "run_bench",
    # hand-written batches (agentlab.batches)
    "batch_frame", "customer_rows", "new_customer", "steps_frame", "tool_calls",
    # the failure lab (agentlab.faults, agentlab.invariants, agentlab.lab, agentlab.experiments, agentlab.charts)
    "AgentProcess", "ExperimentResult", "FAMILIES", "FAULTS", "Fault", "FaultRun", "KINDS", "Lab", "SimulatedCrash",
    "Violation", "check_episode", "check_messages", "count_by_kind", "experiment_heatmap", "fault_table", "get_fault",
    "heatmap", "run_experiment", "run_fault", "safeguard_effects", "summarize",
    # the failure lab as plain calls and as a widget (agentlab.failure_lab, agentlab.widgets, agentlab.ladder)
    "FailureLab", "LabResult", "LabSession", "lab_charts", "lab_run", "ladder_chart", "ledger_chart",
    "rollback_rate_chart", "rung_table",
]
