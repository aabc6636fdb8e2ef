"""agentlab: keeping a database correct while an AI agent calls tools against it.

The public names are re-exported here; ``tests/test_public_api.py`` keeps ``__all__`` in step.
"""

import logging as _logging

from agentlab.approval import (
    APPROVAL, ApprovalPolicy, approval_requests, interrupts_of, pending_requests, resume_command,
)
from agentlab.batches import batch_frame, customer_rows, new_customer, steps_frame, tool_calls
from agentlab.bench import run_bench
from agentlab.charts import experiment_heatmap, heatmap
from agentlab.db import DatabaseUnavailable, create_database, drop_database, server_url
from agentlab.errors import (
    AgentlabError, Category, NotFound, SimulatedCrash, ToolError, UnknownTool, find_leaks, is_infrastructure, translate,
)
from agentlab.events import EventLog
from agentlab.experiments import ExperimentResult, run_experiment, safeguard_effects, summarize
from agentlab.failure_lab import LabResult, LabSession, lab_charts, lab_run, ledger_chart, rollback_rate_chart
from agentlab.faults import FAMILIES, FAULTS, Fault, fault_table, get_fault
from agentlab.graph import AgentState, build_graph, repair_orphans, retry_policy, run_config, unanswered_tool_calls
from agentlab.harness import Episode, Harness
from agentlab.history import fork, replay, replay_and_fork_experiment, run_from, thread_counts, thread_history
from agentlab.invariants import KINDS, Violation, check_episode, check_messages, count_by_kind
from agentlab.jobs import JobFailed, JobLost, JobResult, JobStatus, JobStore, JobTimeout
from agentlab.lab import AgentProcess, FaultRun, Lab, run_fault
from agentlab.ladder import ladder_chart, rung_table
from agentlab.model import ScriptedChatModel, load_model
from agentlab.node import BatchResult, CallResult, Outcome, TransactionalToolsNode, idempotency_key
from agentlab.notifier import NOTIFY_TOPIC, FakeNotifier
from agentlab.observability import node_summary, observe_node, run_events, timeline_chart
from agentlab.outbox import DrainStats, OutboxWorker, outbox_counts
from agentlab.provider import Clock, FakePaymentProvider, IdempotencyConflict, ProviderTimeout, ProviderUnavailable
from agentlab.refund_saga import RowLock, payout_input, store_credit_payout
from agentlab.retention import (
    RetentionPolicy, RetentionReport, apply_retention, checkpoint_bytes, retention_chart, retention_experiment,
    thread_activity,
)
from agentlab.saga import (
    Backoff, RunStatus, SagaBusy, SagaDefinition, SagaError, SagaReport, SagaRunner, Step, StepContext, StepStatus,
)
from agentlab.saga_frames import compensation_needed_frame, saga_chart, saga_log_frame, saga_steps_frame
from agentlab.safeguards import PRESET_NOTES, PRESETS, Policy, Safeguards, preset
from agentlab.scenarios import SCENARIOS, C, CustomerSpec, Intended, PlannedCall, Scenario, get_scenario
from agentlab.tenancy import (
    AGENT_ROLE, AgentProbe, CrossTenantEffect, TenantRequired, agent_privileges, compare_isolation,
    create_foreign_customer, cross_tenant_effects, try_as_agent, with_foreign_customer,
)
from agentlab.tools import TOOLS, ToolSpec, get_tool, tool_schemas
from agentlab.widgets import FailureLab

_logging.getLogger("agentlab").addHandler(_logging.NullHandler())

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
