"""agentlab: keeping a database correct while an AI agent calls tools against it.

The public names are re-exported here; ``tests/test_public_api.py`` keeps ``__all__`` in step.
"""

from agentlab.db import DatabaseUnavailable, create_database, drop_database, server_url
from agentlab.errors import (
    AgentlabError, Category, NotFound, SimulatedCrash, ToolError, UnknownTool, find_leaks, is_infrastructure, translate,
)
from agentlab.events import EventLog
from agentlab.faults import FAMILIES, FAULTS, Fault, fault_table, get_fault
from agentlab.graph import AgentState, build_graph, repair_orphans, retry_policy, run_config, unanswered_tool_calls
from agentlab.harness import Episode, Harness
from agentlab.invariants import KINDS, Violation, check_episode, check_messages, count_by_kind
from agentlab.lab import AgentProcess, FaultRun, Lab, run_fault
from agentlab.model import ScriptedChatModel, load_model
from agentlab.node import BatchResult, CallResult, Outcome, TransactionalToolsNode, idempotency_key
from agentlab.outbox import DrainStats, OutboxWorker, outbox_counts
from agentlab.provider import Clock, FakePaymentProvider, IdempotencyConflict, ProviderTimeout, ProviderUnavailable
from agentlab.safeguards import PRESET_NOTES, PRESETS, Policy, Safeguards, preset
from agentlab.scenarios import SCENARIOS, C, CustomerSpec, Intended, PlannedCall, Scenario, get_scenario
from agentlab.tools import TOOLS, ToolSpec, get_tool, tool_schemas

# pandas and matplotlib load on first use of these names (the demo needs neither)
_LAZY = {
    "ExperimentResult": "agentlab.experiments", "run_experiment": "agentlab.experiments",
    "safeguard_effects": "agentlab.experiments", "summarize": "agentlab.experiments",
    "heatmap": "agentlab.charts", "experiment_heatmap": "agentlab.charts",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentlab' has no attribute {name!r}")


__all__ = [
    "AgentProcess", "AgentState", "AgentlabError", "BatchResult", "C", "CallResult", "Category", "Clock",
    "CustomerSpec", "DatabaseUnavailable", "DrainStats", "Episode", "EventLog", "ExperimentResult", "FAMILIES",
    "FAULTS", "FakePaymentProvider", "Fault", "FaultRun", "Harness", "IdempotencyConflict", "Intended", "KINDS",
    "Lab", "NotFound", "OutboxWorker", "Outcome", "PRESETS", "PRESET_NOTES", "PlannedCall", "Policy",
    "ProviderTimeout", "ProviderUnavailable", "SCENARIOS", "Safeguards", "Scenario", "ScriptedChatModel",
    "SimulatedCrash", "TOOLS", "ToolError", "ToolSpec", "TransactionalToolsNode", "UnknownTool", "Violation",
    "build_graph", "check_episode", "check_messages", "count_by_kind", "create_database", "drop_database",
    "experiment_heatmap", "fault_table", "find_leaks", "get_fault", "get_scenario", "get_tool", "heatmap",
    "idempotency_key", "is_infrastructure", "load_model", "outbox_counts", "preset", "repair_orphans",
    "retry_policy", "run_config", "run_experiment", "run_fault", "safeguard_effects", "server_url", "summarize",
    "tool_schemas", "translate", "unanswered_tool_calls",
]
